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
	// MaxLoad is the highest load a run's figures may be taken at (see
	// RunLoad.Load). A run above it is run once more; if the second one is
	// above it too, its figures are reported as refused. Default 3.
	MaxLoad float64
	// Settle is how long to wait, before each run, for the 1-minute load
	// average to fall to MaxLoad (the previous run's own load decays).
	// Default 60s.
	Settle time.Duration
	// Load reads the 1-minute load average and the busy CPU time of the
	// whole machine (tests replace it). Default: /proc/loadavg, /proc/stat.
	Load func() (loadAverage float64, busy time.Duration)
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
	if opts.MaxLoad <= 0 {
		opts.MaxLoad = 3
	}
	if opts.Settle <= 0 {
		opts.Settle = time.Minute
	}
	if opts.Load == nil {
		opts.Load = machineLoad
	}
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
	rep := &Report{Count: opts.Count, Machine: ReadMachine(), MaxLoad: opts.MaxLoad}
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
	MarkRefused(rep.Figures, opts.MaxLoad)
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
		var res []PackageResult
		var load RunLoad
		var runErr error
		for attempt := 1; attempt <= 2; attempt++ {
			res, load, runErr = runOnce(ctx, p, opts, bin, extra, usesJSON, i, &cpu)
			load.Attempt = attempt
			if runErr != nil || load.Load <= opts.MaxLoad {
				break
			}
			if attempt == 1 {
				fmt.Fprintf(opts.Log, "report: %s run %d: load %.2f > %.2f, running it again\n", p.ImportPath, i+1, load.Load, opts.MaxLoad)
			}
		}
		run.Loads = append(run.Loads, load)
		for j := range res {
			res[j].Load = load.Load
		}
		results = append(results, res...)
		if runErr != nil {
			return results, cpu, fmt.Errorf("run %d: %w", i+1, runErr)
		}
		run.Runs++
	}
	return results, cpu, nil
}

// runOnce runs the test binary once, after waiting (up to opts.Settle) for
// the load to settle, and measures the load around it.
func runOnce(ctx context.Context, p pkgInfo, opts RunOptions, bin string, extra []string, usesJSON bool, i int, cpu *string) ([]PackageResult, RunLoad, error) {
	deadline := time.Now().Add(opts.Settle)
	before, busy0 := opts.Load()
	for before > opts.MaxLoad && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return nil, RunLoad{}, ctx.Err()
		case <-time.After(5 * time.Second):
		}
		before, busy0 = opts.Load()
	}
	args := []string{"-test.run=^$", "-test.bench=" + opts.Bench, "-test.benchmem", "-test.count=1"}
	args = append(args, extra...)
	jsonFile := ""
	if usesJSON {
		jsonFile = filepath.Join(opts.WorkDir, fmt.Sprintf("%s.run%d.json", filepath.Base(bin), i+1))
		_ = os.Remove(jsonFile)
		args = append(args, "-"+benchjson.FlagName+"="+jsonFile)
	}
	fmt.Fprintf(opts.Log, "report: %s run %d/%d (load average %.2f)\n", p.ImportPath, i+1, opts.Count, before)
	var buf bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = p.Dir
	// Only standard output is parsed: libraries' warnings on standard
	// error would split benchmark lines.
	cmd.Stdout = io.MultiWriter(&buf, opts.Log)
	cmd.Stderr = opts.Log
	start := time.Now()
	runErr := cmd.Run()
	wall := time.Since(start)
	after, busy1 := opts.Load()
	load := RunLoad{Before: before, After: after, Seconds: wall.Seconds()}
	if ps := cmd.ProcessState; ps != nil && wall > 0 {
		// The run's own CPU (its process and the children it waited for:
		// kube-apiserver, etcd) over the wall time: what it added to the
		// load itself.
		load.OwnCores = (ps.UserTime() + ps.SystemTime()).Seconds() / wall.Seconds()
		if busy1 > busy0 {
			load.OtherCores = max(0, (busy1-busy0).Seconds()/wall.Seconds()-load.OwnCores)
		}
	}
	load.Load = judgedLoad(load)
	var results []PackageResult
	out, err := ParseGoBench(&buf)
	if err != nil {
		return nil, load, err
	}
	if out.CPU != "" {
		*cpu = out.CPU
	}
	for _, r := range out.Results {
		r.Package = p.ImportPath
		results = append(results, r)
	}
	if jsonFile != "" {
		f, err := benchjson.Read(jsonFile)
		if err != nil && !(runErr != nil && errors.Is(err, os.ErrNotExist)) {
			return results, load, err
		}
		if f != nil {
			for _, r := range f.Results {
				results = append(results, PackageResult{Package: p.ImportPath, Procs: runtime.GOMAXPROCS(0), Result: r})
			}
		}
	}
	return results, load, runErr
}

// RunLoad is the machine's load around one run of a benchmark package.
type RunLoad struct {
	// Before and After are the 1-minute load averages right before and
	// right after the run.
	Before float64 `json:"before"`
	After  float64 `json:"after"`
	// OwnCores is the run's own CPU use (the benchmark process and the
	// API server and etcd it started) in cores, averaged over the run.
	OwnCores float64 `json:"ownCores"`
	// OtherCores is the CPU everything else on the machine used during the
	// run, in cores, averaged over the run.
	OtherCores float64 `json:"otherCores"`
	// Load is the load the run's figures were taken at (judgedLoad): the
	// larger of the load average before it and, when something else used
	// the machine during the run, the load average after it less its own
	// cores (the run's own work is not "other load").
	Load float64 `json:"load"`
	// Attempt is 2 when the first run was above MaxLoad and ran again.
	Attempt int     `json:"attempt"`
	Seconds float64 `json:"seconds"`
}

// quietCores is the CPU everything else may use during a run, in cores,
// for the machine to count as idle: a shell, the report runner, the
// kernel's own threads.
const quietCores = 0.1

// judgedLoad is the load a run's figures count as taken at. The load
// average before the run says whether the machine was idle when it began.
// The one after it also counts the run's own work, which the run's average
// own cores subtract only for a run of even load: a run that ends in its
// heaviest phase (10,000 relayed streams receiving a large push) leaves a
// 1-minute load average well above its average own cores with the machine
// otherwise idle. So the load after the run counts only when something
// else measurably used the CPU during it (OtherCores, from /proc/stat less
// the run's own CPU).
func judgedLoad(l RunLoad) float64 {
	if l.OtherCores < quietCores {
		return l.Before
	}
	return max(l.Before, l.After-l.OwnCores)
}

// machineLoad reads the 1-minute load average and the machine's busy CPU
// time (all CPUs, /proc/stat: everything but idle and iowait).
func machineLoad() (float64, time.Duration) {
	var busy time.Duration
	if data, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(data), "\n")
		f := strings.Fields(line)
		if len(f) > 5 && f[0] == "cpu" {
			var ticks float64
			for j, v := range f[1:] {
				if j == 3 || j == 4 { // idle, iowait
					continue
				}
				x, _ := strconv.ParseFloat(v, 64)
				ticks += x
			}
			busy = time.Duration(ticks * float64(time.Second) / 100) // USER_HZ
		}
	}
	return loadAverage(), busy
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
