// Package benchjson is the small JSON format in which an Embark benchmark
// hands its figures to the report generator (benchmarks/cmd/report) when
// the standard `go test -bench` output cannot carry them, for instance a
// figure measured once per run (time until 1,000 disconnects are stored)
// or a figure with its baseline measured inside the same benchmark.
//
// A benchmark package adopts it by calling Flag once at package level:
//
//	var jsonOut = benchjson.Flag()
//
// which defines the `-json <file>` test flag (`go test -bench=. ./x -args
// -json out.json`), and by writing its results with WriteFile at the end
// of TestMain or of the benchmark. The report generator runs every
// benchmark package several times (one process per run), passes -json to
// the packages that import this package, and reads the file back: every
// Result of one file is one run of that figure.
package benchjson

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
)

// FlagName is the test flag naming the output file.
const FlagName = "json"

// Result is one figure of one run.
type Result struct {
	// Name identifies the figure within its package, e.g.
	// "Streams/held=1000"; the same Name and Unit in several runs are
	// aggregated (median, min, max).
	Name string `json:"name"`
	// Unit of Value, e.g. "streams", "MiB", "ms", "ops/s".
	Unit string `json:"unit"`
	// Value measured in this run.
	Value float64 `json:"value"`
	// Baseline, when set, names the figure (Name in the same package, same
	// Unit unless BaselineUnit says otherwise) this one is compared with,
	// e.g. "BareGoControlPlane/held=1000".
	Baseline     string `json:"baseline,omitempty"`
	BaselineUnit string `json:"baselineUnit,omitempty"`
	// BaselineValue and Ratio (Value / BaselineValue), when the benchmark
	// measured its baseline itself; the report recomputes Ratio from the
	// medians when Baseline names another Result.
	BaselineValue float64 `json:"baselineValue,omitempty"`
	Ratio         float64 `json:"ratio,omitempty"`
	// Runs the benchmark made to produce Value (for example b.N), for the
	// report only.
	Runs int `json:"runs,omitempty"`
	// Note is one short sentence of context shown in the report.
	Note string `json:"note,omitempty"`
}

// File is the content of a -json file.
type File struct {
	// Package is the import path of the benchmark package (optional; the
	// report knows which package it ran).
	Package string   `json:"package,omitempty"`
	Results []Result `json:"results"`
}

// Flag defines the -json test flag and returns its value. Call it once, at
// package level, in the benchmark package.
func Flag() *string {
	return flag.String(FlagName, "", "write the benchmark figures to this file in the benchjson format")
}

// Validate checks that every Result has a Name and a Unit.
func (f *File) Validate() error {
	var errs []error
	for i, r := range f.Results {
		if r.Name == "" {
			errs = append(errs, fmt.Errorf("results[%d]: name is empty", i))
		}
		if r.Unit == "" {
			errs = append(errs, fmt.Errorf("results[%d] (%s): unit is empty", i, r.Name))
		}
	}
	return errors.Join(errs...)
}

// Read parses a -json file.
func Read(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read benchmark results: %w", err)
	}
	return Parse(data)
}

// Parse parses the content of a -json file.
func Parse(data []byte) (*File, error) {
	var f File
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("parse benchmark results: %w", err)
	}
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("benchmark results: %w", err)
	}
	return &f, nil
}

// Recorder collects Results from concurrent benchmarks and writes them once.
type Recorder struct {
	mu      sync.Mutex
	results []Result
}

// Add records results.
func (r *Recorder) Add(results ...Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.results = append(r.results, results...)
}

// WriteFile writes the recorded results to path; an empty path (no -json
// flag) writes nothing.
func (r *Recorder) WriteFile(path, pkg string) error {
	if path == "" {
		return nil
	}
	r.mu.Lock()
	f := File{Package: pkg, Results: append([]Result(nil), r.results...)}
	r.mu.Unlock()
	if err := f.Validate(); err != nil {
		return err
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encode benchmark results: %w", err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write benchmark results: %w", err)
	}
	return nil
}
