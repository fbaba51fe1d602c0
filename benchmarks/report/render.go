package report

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Machine describes where the benchmarks ran.
type Machine struct {
	CPUs       int     `json:"cpus"`
	GOMAXPROCS int     `json:"gomaxprocs"`
	CPU        string  `json:"cpu,omitempty"`
	MemoryGiB  float64 `json:"memoryGiB"`
	OS         string  `json:"os"`
	Arch       string  `json:"arch"`
	GoVersion  string  `json:"goVersion"`
	// LoadAverage is the 1-minute load average when the runs started and
	// ended: a figure above CPUs means other work shared the machine.
	LoadAverageStart float64 `json:"loadAverageStart,omitempty"`
	LoadAverageEnd   float64 `json:"loadAverageEnd,omitempty"`
}

// PackageRun is how one benchmark package ran.
type PackageRun struct {
	Package string  `json:"package"`
	Runs    int     `json:"runs"`
	Seconds float64 `json:"seconds"`
	JSON    bool    `json:"json"`
	Error   string  `json:"error,omitempty"`
	// Loads are the load around each run, in order.
	Loads []RunLoad `json:"loads,omitempty"`
}

// Report is a whole benchmark report.
type Report struct {
	Date    time.Time `json:"date"`
	Commit  string    `json:"commit,omitempty"`
	Command string    `json:"command"`
	Count   int       `json:"count"`
	// MaxLoad is the load above which a figure is refused.
	MaxLoad  float64      `json:"maxLoad,omitempty"`
	Machine  Machine      `json:"machine"`
	Packages []PackageRun `json:"packages"`
	Figures  []Figure     `json:"figures"`
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	return nil
}

// WriteMarkdown writes the report as Markdown: the machine, then one table
// per package with each figure's median, spread and ratio to its baseline.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmark report %s\n\n", r.Date.UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "`%s` (%d runs of each package, one process per run)", r.Command, r.Count)
	if r.Commit != "" {
		fmt.Fprintf(&b, " at commit `%s`", r.Commit)
	}
	b.WriteString(".\n\n")
	m := r.Machine
	fmt.Fprintf(&b, "Machine: %d CPUs (GOMAXPROCS %d)", m.CPUs, m.GOMAXPROCS)
	if m.CPU != "" {
		fmt.Fprintf(&b, ", %s", m.CPU)
	}
	fmt.Fprintf(&b, ", %.1f GiB memory, %s/%s, %s; 1-minute load average %.2f at the start, %.2f at the end",
		m.MemoryGiB, m.OS, m.Arch, m.GoVersion, m.LoadAverageStart, m.LoadAverageEnd)
	// Only the start says whether others shared the machine: the end's
	// load average is mostly the last run's own (each figure's load, less
	// its run's own CPU, is judged per figure below).
	if m.LoadAverageStart > float64(m.CPUs) {
		b.WriteString(" (busier than its CPUs when the runs began: read the ratios, not the absolute figures)")
	}
	b.WriteString(".\n\n")
	if r.MaxLoad > 0 {
		writeTargets(&b, EvaluateTargets(r.Figures, Targets), r.MaxLoad)
		b.WriteString("\n## Figures\n\n")
	}
	b.WriteString("Median of the runs; spread = (max − min) / median; ratio = median / the baseline's median, both measured in the same runs.\n")
	for _, p := range r.Packages {
		fmt.Fprintf(&b, "\n## %s\n\n", p.Package)
		fmt.Fprintf(&b, "%d runs, %.0f s", p.Runs, p.Seconds)
		if p.JSON {
			b.WriteString(", benchjson output")
		}
		b.WriteString(".")
		for i, l := range p.Loads {
			fmt.Fprintf(&b, " Run %d: load average %.2f before, %.2f after, own CPU %.2f cores, others %.2f cores", i+1, l.Before, l.After, l.OwnCores, l.OtherCores)
			if l.Attempt > 1 {
				b.WriteString(" (second attempt)")
			}
			b.WriteString(".")
		}
		b.WriteString("\n")
		if p.Error != "" {
			fmt.Fprintf(&b, "\n**Failed:** %s\n", p.Error)
		}
		rows := 0
		for _, f := range r.Figures {
			if f.Package != p.Package {
				continue
			}
			if rows == 0 {
				b.WriteString("\n| figure | unit | median | min | max | spread | baseline | baseline median | ratio | load |\n")
				b.WriteString("| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |\n")
			}
			rows++
			base, baseMedian, ratio := "", "", ""
			if f.Baseline != "" && f.BaselineMedian != 0 {
				base = f.Baseline
				if f.BaselineUnit != f.Unit {
					base += " (" + f.BaselineUnit + ")"
				}
				baseMedian, ratio = Format(f.BaselineMedian), fmt.Sprintf("%.2f", f.Ratio)
			}
			median := Format(f.Median)
			load := fmt.Sprintf("%.2f", f.Load)
			if f.Refused {
				median, load = "~~"+median+"~~ refused", load+" (refused)"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.0f%% | %s | %s | %s | %s |\n", f.Name, f.Unit,
				median, Format(f.Min), Format(f.Max), 100*f.Spread, base, baseMedian, ratio, load)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Format prints a figure with three significant digits (whole numbers
// from 1,000 up).
func Format(v float64) string {
	a := v
	if a < 0 {
		a = -a
	}
	switch {
	case a >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a == 0:
		return "0"
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}
