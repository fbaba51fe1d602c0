package report

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/embark-mesh/embark/benchmarks/benchjson"
)

// benchjsonImport is the import path that marks a package writing benchjson.
const benchjsonImport = "github.com/embark-mesh/embark/benchmarks/benchjson"

// Directive is the comment prefix with which a benchmark package gives the
// runner extra test flags, e.g. `//embark:bench -test.benchtime=400x`.
const Directive = "//embark:bench "

// RunOptions configures Run.
type RunOptions struct {
	// Patterns are the packages (default ./benchmarks/...).
	Patterns []string
	// Count is the number of runs (processes) of each package.
	Count int
	// Bench is the -test.bench pattern (default ".").
	Bench string
	// WorkDir holds the compiled test binaries and the runs' output.
	WorkDir string
	// Log receives every run's output as it happens.
	Log io.Writer
}

type pkgInfo struct {
	ImportPath   string
	Dir          string
	TestGoFiles  []string
	XTestGoFiles []string
	TestImports  []string
	XTestImports []string
}

// Run compiles every benchmark package (those whose tests declare a
// Benchmark function) and runs each Count times, one process per run,
// passing -json to packages that import benchjson. It returns the report
// (Figures and Packages; the caller fills in Date and Command).
func Run(ctx context.Context, opts RunOptions) (*Report, error) {
	if len(opts.Patterns) == 0 {
		opts.Patterns = []string{"./benchmarks/..."}
	}
	opts.Count = max(opts.Count, 1)
	if opts.Bench == "" {
		opts.Bench = "."
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	pkgs, err := list(ctx, opts.Patterns)
	if err != nil {
		return nil, err
	}
	rep := &Report{Count: opts.Count, Machine: ReadMachine()}
	rep.Machine.LoadAverageStart = loadAverage()
	var all []PackageResult
	for _, p := range pkgs {
		files := append(append([]string(nil), p.TestGoFiles...), p.XTestGoFiles...)
		hasBench, extra, err := scan(p.Dir, files)
		if err != nil {
			return nil, err
		}
		if !hasBench {
			continue
		}
		usesJSON := contains(p.TestImports, benchjsonImport) || contains(p.XTestImports, benchjsonImport)
		run := PackageRun{Package: p.ImportPath, JSON: usesJSON}
		start := time.Now()
		results, cpu, err := runPackage(ctx, p, opts, extra, usesJSON, &run)
		run.Seconds = time.Since(start).Seconds()
		if err != nil {
			run.Error = err.Error()
			fmt.Fprintf(opts.Log, "report: %s: %v\n", p.ImportPath, err)
		}
		if cpu != "" {
			rep.Machine.CPU = cpu
		}
		all = append(all, results...)
		rep.Packages = append(rep.Packages, run)
	}
	rep.Machine.LoadAverageEnd = loadAverage()
	rep.Figures = Summarize(all, Rules)
	return rep, nil
}

func runPackage(ctx context.Context, p pkgInfo, opts RunOptions, extra []string, usesJSON bool, run *PackageRun) ([]PackageResult, string, error) {
	bin := filepath.Join(opts.WorkDir, strings.ReplaceAll(p.ImportPath, "/", "_")+".test")
	build := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin, p.ImportPath)
	if out, err := build.CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("compile: %w: %s", err, bytes.TrimSpace(out))
	}
	var results []PackageResult
	cpu := ""
	for i := range opts.Count {
		args := []string{"-test.run=^$", "-test.bench=" + opts.Bench, "-test.benchmem", "-test.count=1"}
		args = append(args, extra...)
		jsonFile := ""
		if usesJSON {
			jsonFile = filepath.Join(opts.WorkDir, fmt.Sprintf("%s.run%d.json", filepath.Base(bin), i+1))
			_ = os.Remove(jsonFile)
			args = append(args, "-"+benchjson.FlagName+"="+jsonFile)
		}
		fmt.Fprintf(opts.Log, "report: %s run %d/%d\n", p.ImportPath, i+1, opts.Count)
		var buf bytes.Buffer
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = p.Dir
		// Only standard output is parsed: libraries' warnings on standard
		// error would split benchmark lines.
		cmd.Stdout = io.MultiWriter(&buf, opts.Log)
		cmd.Stderr = opts.Log
		runErr := cmd.Run()
		out, err := ParseGoBench(&buf)
		if err != nil {
			return results, cpu, fmt.Errorf("run %d: %w", i+1, err)
		}
		if out.CPU != "" {
			cpu = out.CPU
		}
		for _, r := range out.Results {
			r.Package = p.ImportPath
			results = append(results, r)
		}
		if jsonFile != "" {
			f, err := benchjson.Read(jsonFile)
			if err != nil && !(runErr != nil && errors.Is(err, os.ErrNotExist)) {
				return results, cpu, fmt.Errorf("run %d: %w", i+1, err)
			}
			if f != nil {
				for _, r := range f.Results {
					results = append(results, PackageResult{Package: p.ImportPath, Procs: runtime.GOMAXPROCS(0), Result: r})
				}
			}
		}
		if runErr != nil {
			return results, cpu, fmt.Errorf("run %d: %w", i+1, runErr)
		}
		run.Runs++
	}
	return results, cpu, nil
}

func list(ctx context.Context, patterns []string) ([]pkgInfo, error) {
	cmd := exec.CommandContext(ctx, "go", append([]string{"list", "-json=ImportPath,Dir,TestGoFiles,XTestGoFiles,TestImports,XTestImports"}, patterns...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %w: %s", strings.Join(patterns, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	var pkgs []pkgInfo
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p pkgInfo
		if err := dec.Decode(&p); err != nil {
			return nil, fmt.Errorf("go list output: %w", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}

// scan reports whether the test files declare a benchmark, and the flags
// of their //embark:bench directives.
func scan(dir string, files []string) (bool, []string, error) {
	has := false
	var extra []string
	for _, name := range files {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return false, nil, fmt.Errorf("read %s: %w", name, err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "func Benchmark") {
				has = true
			}
			if rest, ok := strings.CutPrefix(line, Directive); ok {
				extra = append(extra, strings.Fields(rest)...)
			}
		}
		err = sc.Err()
		_ = f.Close()
		if err != nil {
			return false, nil, fmt.Errorf("read %s: %w", name, err)
		}
	}
	return has, extra, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// ReadMachine describes this machine.
func ReadMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), OS: runtime.GOOS, Arch: runtime.GOARCH, GoVersion: runtime.Version()}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				f := strings.Fields(rest)
				if len(f) > 0 {
					if kb, err := strconv.ParseFloat(f[0], 64); err == nil {
						m.MemoryGiB = kb / (1 << 20)
					}
				}
			}
		}
	}
	return m
}

func loadAverage() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
