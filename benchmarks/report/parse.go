// Package report turns benchmark runs into Embark's benchmark report: it
// parses standard `go test -bench` output and benchjson files, aggregates
// the runs of each figure (median, min, max), pairs each figure with its
// baseline measured in the same runs, and renders Markdown and JSON
// (benchmarks/results/<date>.md and .json). The runner that compiles and
// runs every benchmark package is Run; the command is benchmarks/cmd/report.
package report

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/embark-mesh/embark/benchmarks/benchjson"
)

// Output is what one `go test -bench` run printed, parsed.
type Output struct {
	// Package is the import path from the "pkg:" line.
	Package string
	// CPU is the processor from the "cpu:" line.
	CPU string
	// Results holds one Result per metric of each benchmark line, Name
	// without the "Benchmark" prefix and the "-GOMAXPROCS" suffix.
	Results []PackageResult
}

// PackageResult is a Result with the package it came from.
type PackageResult struct {
	Package string
	Procs   int
	// Load is the load the run was taken at (RunLoad.Load; 0: unknown).
	Load float64
	benchjson.Result
}

var procsSuffix = regexp.MustCompile(`-(\d+)$`)

// ParseGoBench reads `go test -bench` output (several packages may follow
// each other, as with ./...). Lines that are not benchmark results are
// ignored; a benchmark line that does not parse is an error.
func ParseGoBench(r io.Reader) (*Output, error) {
	out := &Output{}
	pkg := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	line := 0
	// pending is a benchmark name printed alone: its figures follow on a
	// later line when the benchmark logged in between (as a library
	// writing to the same stream does).
	pending := ""
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if f := strings.Fields(text); pending != "" && len(f) >= 3 && len(f)%2 == 1 {
			if _, err := strconv.Atoi(f[0]); err == nil {
				text = pending + " " + text
			}
		}
		switch {
		case strings.HasPrefix(text, "pkg: "):
			pkg = strings.TrimSpace(strings.TrimPrefix(text, "pkg: "))
			if out.Package == "" {
				out.Package = pkg
			}
			continue
		case strings.HasPrefix(text, "cpu: "):
			out.CPU = strings.TrimSpace(strings.TrimPrefix(text, "cpu: "))
			continue
		case !strings.HasPrefix(text, "Benchmark"):
			continue
		}
		fields := strings.Fields(text)
		// "BenchmarkX-2" alone is the name printed before a benchmark's
		// own log lines; its figures follow on a later line.
		pending = ""
		if len(fields) == 1 {
			pending = fields[0]
			continue
		}
		n, err := strconv.Atoi(fields[1])
		if err != nil {
			// A name followed by someone else's output, or a log line
			// that merely starts with "Benchmark".
			if procsSuffix.MatchString(fields[0]) {
				pending = fields[0]
			}
			continue
		}
		if len(fields) < 4 || len(fields)%2 != 0 {
			continue
		}
		name := strings.TrimPrefix(fields[0], "Benchmark")
		procs := 1
		if m := procsSuffix.FindStringSubmatch(name); m != nil {
			procs, _ = strconv.Atoi(m[1])
			name = strings.TrimSuffix(name, m[0])
		}
		if name == "" {
			return nil, fmt.Errorf("line %d: benchmark without a name: %q", line, text)
		}
		for i := 2; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				return nil, fmt.Errorf("line %d: value %q of %s: %w", line, fields[i], fields[i+1], err)
			}
			out.Results = append(out.Results, PackageResult{Package: pkg, Procs: procs,
				Result: benchjson.Result{Name: name, Unit: fields[i+1], Value: v, Runs: n}})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read benchmark output: %w", err)
	}
	return out, nil
}
