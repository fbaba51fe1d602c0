// Command report runs every benchmark package under benchmarks/ several
// times and writes benchmarks/results/<date>.md and .json (see
// benchmarks/report), or, with -from, builds the same report from saved
// `go test -bench` output.
//
//	go run ./benchmarks/cmd/report -count 3
//	go test -run='^$' -bench=. ./benchmarks/identity/ | tee out.txt
//	go run ./benchmarks/cmd/report -from out.txt
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/embark-mesh/embark/benchmarks/report"
)

func main() {
	count := flag.Int("count", 3, "runs (processes) of each benchmark package")
	bench := flag.String("bench", ".", "benchmarks to run (-test.bench pattern)")
	outDir := flag.String("out", "benchmarks/results", "directory of the report files")
	from := flag.String("from", "", "build the report from this saved `go test -bench` output instead of running")
	maxLoad := flag.Float64("max-load", 3, "refuse figures taken above this load (a run above it is run once more first)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *count, *bench, *outDir, *from, *maxLoad, flag.Args()); err != nil {
		fmt.Fprintf(os.Stderr, "report: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, count int, bench, outDir, from string, maxLoad float64, patterns []string) error {
	start := time.Now()
	var rep *report.Report
	if from != "" {
		f, err := os.Open(from)
		if err != nil {
			return err
		}
		defer f.Close()
		out, err := report.ParseGoBench(f)
		if err != nil {
			return err
		}
		rep = &report.Report{Command: "go test -bench (saved in " + filepath.Base(from) + ")", Count: count, Machine: report.ReadMachine()}
		rep.Machine.CPU = out.CPU
		seen := map[string]bool{}
		for _, r := range out.Results {
			if !seen[r.Package] {
				seen[r.Package] = true
				rep.Packages = append(rep.Packages, report.PackageRun{Package: r.Package, Runs: count})
			}
		}
		rep.Figures = report.Summarize(out.Results, report.Rules)
	} else {
		work, err := os.MkdirTemp("", "embark-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(work)
		rep, err = report.Run(ctx, report.RunOptions{Patterns: patterns, Count: count, Bench: bench, WorkDir: work, Log: os.Stderr, MaxLoad: maxLoad})
		if err != nil {
			return err
		}
		rep.Command = fmt.Sprintf("make bench BENCH_COUNT=%d", count)
	}
	rep.Date = start.UTC()
	if out, err := exec.CommandContext(ctx, "git", "describe", "--always", "--dirty").Output(); err == nil {
		rep.Commit = strings.TrimSpace(string(out))
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	base := filepath.Join(outDir, rep.Date.Format("2006-01-02"))
	for ext, write := range map[string]func(*os.File) error{
		".md":   func(f *os.File) error { return rep.WriteMarkdown(f) },
		".json": func(f *os.File) error { return rep.WriteJSON(f) },
	} {
		f, err := os.Create(base + ext)
		if err != nil {
			return err
		}
		if err := write(f); err != nil {
			_ = f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "report: wrote %s.md and %s.json\n", base, base)
	failed := 0
	for _, p := range rep.Packages {
		if p.Error != "" {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d benchmark package(s) failed (see the report)", failed)
	}
	return nil
}
