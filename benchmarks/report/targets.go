package report

import (
	"fmt"
	"math"
	"strings"
)

// Target is one of the project's scale targets (docs/benchmarks.md) and how to read
// it from a report's figures.
type Target struct {
	// Package is the import path's suffix of the figures.
	Package string
	// Figure and Unit name the Embark figure the target is about.
	Figure, Unit string
	// Text says the target, e.g. "≤ 3 s".
	Text string
	// Check computes the value compared with the target (Embark's figure,
	// or what the target is about, e.g. the push time after the debounce),
	// the limit it must not cross and whether it is met. ok is false when a
	// figure it needs is missing.
	Check func(get func(name, unit string) (Figure, bool)) (value, limit float64, met, ok bool)
}

// Targets are the project's scale targets.
var Targets = []Target{
	{Package: "benchmarks/push", Figure: "SidecarChange/workloads=1000", Unit: "ms/push",
		Text: "from the change seen, after the debounce: ≤ 1,000 ms and ≤ 1.5 × raw fan-out",
		Check: func(get func(string, string) (Figure, bool)) (float64, float64, bool, bool) {
			// From the endpoint's informer seeing the change, as the raw
			// fan-out is from its first SetSnapshot (neither includes the
			// API server's write); ms/push, from the write, if that is all
			// a report has.
			f, ok1 := get("SidecarChange/workloads=1000", "seen-ms/push")
			if !ok1 {
				f, ok1 = get("SidecarChange/workloads=1000", "ms/push")
			}
			d, ok2 := get("SidecarChange/workloads=1000", "debounce-ms")
			raw, ok3 := get("RawSnapshotFanOut/workloads=1000", "ms/push")
			if !ok1 || !ok2 || !ok3 {
				return 0, 0, false, false
			}
			v := f.Median - d.Median
			limit := math.Min(1000, 1.5*raw.Median)
			return v, limit, v <= limit, true
		}},
	{Package: "benchmarks/streams", Figure: "MassDisconnect/streams=1000", Unit: "s", Text: "≤ 3 s", Check: atMost("MassDisconnect/streams=1000", "s", 3)},
	{Package: "benchmarks/streams", Figure: "StormTime/streams=1000", Unit: "s", Text: "≤ 10 s", Check: atMost("StormTime/streams=1000", "s", 10)},
	{Package: "benchmarks/streams", Figure: "StormStatusWrites/streams=1000", Unit: "writes/workload", Text: "≤ 1", Check: atMost("StormStatusWrites/streams=1000", "writes/workload", 1)},
	{Package: "benchmarks/streams", Figure: "StormEntryWrites/streams=1000", Unit: "writes/workload", Text: "≤ 1", Check: atMost("StormEntryWrites/streams=1000", "writes/workload", 1)},
	{Package: "benchmarks/streams", Figure: "StormRecreated/streams=1000", Unit: "objects", Text: "0", Check: atMost("StormRecreated/streams=1000", "objects", 0)},
	{Package: "benchmarks/streams", Figure: "Held/streams=10000", Unit: "B/stream", Text: "≤ 1.3 × bare go-control-plane",
		Check: func(get func(string, string) (Figure, bool)) (float64, float64, bool, bool) {
			f, ok1 := get("Held/streams=10000", "B/stream")
			bare, ok2 := get("Bare/streams=10000", "B/stream")
			if !ok1 || !ok2 {
				return 0, 0, false, false
			}
			return f.Median, 1.3 * bare.Median, f.Median <= 1.3*bare.Median, true
		}},
	{Package: "benchmarks/burst", Figure: "Burst/vms=500", Unit: "s",
		Text:  "≤ 1.25 × bound (the API server's own time for the same API calls + istiod's own time to sign the same CSRs, same run)",
		Check: atMostTimes("Burst/vms=500", "BurstBound/vms=500", "s", 1.25)},
	{Package: "benchmarks/relay", Figure: "RelayedServerHeap/streams=10000/per-conn=1", Unit: "B/stream", Text: "≤ 1.0 × istiod direct (Embark + istiod per relayed stream)",
		Check: atMostTimes("RelayedServerHeap/streams=10000/per-conn=1", "DirectServerHeap/streams=10000/per-conn=1", "B/stream", 1.0)},
	{Package: "benchmarks/relay", Figure: "RelayedP99/streams=10000/per-conn=1", Unit: "ms", Text: "< 5 ms added to a response at p99 (relayed − direct)",
		Check: func(get func(string, string) (Figure, bool)) (float64, float64, bool, bool) {
			f, ok1 := get("RelayedP99/streams=10000/per-conn=1", "ms")
			d, ok2 := get("DirectP99/streams=10000/per-conn=1", "ms")
			if !ok1 || !ok2 {
				return 0, 0, false, false
			}
			v := f.Median - d.Median
			return v, 5, v < 5, true
		}},
	{Package: "benchmarks/relay", Figure: "LargePushRelayed/streams=10000/per-conn=1", Unit: "ms", Text: "≤ 1.25 × direct (a ~1 MB configuration pushed to every stream, until the last ACK)",
		Check: atMostTimes("LargePushRelayed/streams=10000/per-conn=1", "LargePushDirect/streams=10000/per-conn=1", "ms", 1.25)},
	{Package: "benchmarks/burst", Figure: "RenewalFailures/sidecars=1000", Unit: "renewals", Text: "0", Check: atMost("RenewalFailures/sidecars=1000", "renewals", 0)},
	{Package: "benchmarks/burst", Figure: "Renewals/sidecars=1000", Unit: "renewals/s", Text: "≥ 0.95 × the same CSRs straight to istiod at the same offered rate",
		Check: func(get func(string, string) (Figure, bool)) (float64, float64, bool, bool) {
			f, ok1 := get("Renewals/sidecars=1000", "renewals/s")
			d, ok2 := get("RenewalsDirect/sidecars=1000", "renewals/s")
			if !ok1 || !ok2 {
				return 0, 0, false, false
			}
			return f.Median, 0.95 * d.Median, f.Median >= 0.95*d.Median, true
		}},
	{Package: "benchmarks/onboarding", Figure: "Onboarding/agents=50", Unit: "onboardings/s",
		Text: "≥ 0.8 × raw API calls/s ÷ API calls per onboarding (writes + TokenRequests)",
		Check: func(get func(string, string) (Figure, bool)) (float64, float64, bool, bool) {
			f, ok1 := get("Onboarding/agents=50", "onboardings/s")
			raw, ok2 := get("Onboarding/raw/clients=50", "creates/s")
			w, ok3 := get("Onboarding/agents=50", "writes/onboarding")
			tr, ok4 := get("Onboarding/agents=50", "tokenrequests/onboarding")
			if !ok1 || !ok2 || !ok3 || !ok4 || w.Median+tr.Median == 0 {
				return 0, 0, false, false
			}
			// One raw operation creates two objects: two API calls.
			limit := 0.8 * 2 * raw.Median / (w.Median + tr.Median)
			return f.Median, limit, f.Median >= limit, true
		}},
	onboardingP99(10),
	onboardingP99(50),
	{Package: "benchmarks/authorize", Figure: "AuthorizeScale/document/policies=1000", Unit: "ops/s/core",
		Text:  "≥ 12,000 verifications + decisions/s per core with 1,000 policies (document path)",
		Check: atLeast("AuthorizeScale/document/policies=1000", "ops/s/core", 12000)},
	{Package: "benchmarks/authorize", Figure: "AuthorizeScale/document/policies=1000", Unit: "ops/s/core",
		Text:  "≥ 0.9 × the same with the 1 matching policy alone (independent of unrelated policies)",
		Check: atLeastTimes("AuthorizeScale/document/policies=1000", "AuthorizeScale/document/policies=1", "ops/s/core", 0.9)},
	{Package: "benchmarks/authorize", Figure: "AuthorizeScale/sts/policies=1000", Unit: "ops/s/core",
		Text:  "≥ 0.5 × the document path with 1,000 policies (STS-proof path)",
		Check: atLeastTimes("AuthorizeScale/sts/policies=1000", "AuthorizeScale/document/policies=1000", "ops/s/core", 0.5)},
}

// onboardingP99 is the latency target of one onboarding at agents
// concurrent agents: its p99 at most twice the p99 of the raw creates of
// the same two objects at the same concurrency, measured right after it.
func onboardingP99(agents int) Target {
	name, raw := fmt.Sprintf("Onboarding/agents=%d", agents), fmt.Sprintf("Onboarding/raw/clients=%d", agents)
	return Target{Package: "benchmarks/onboarding", Figure: name, Unit: "p99-ms", Text: "≤ 2 × raw p99",
		Check: func(get func(string, string) (Figure, bool)) (float64, float64, bool, bool) {
			f, ok1 := get(name, "p99-ms")
			r, ok2 := get(raw, "p99-ms")
			if !ok1 || !ok2 {
				return 0, 0, false, false
			}
			return f.Median, 2 * r.Median, f.Median <= 2*r.Median, true
		}}
}

// atLeast judges name's median against a lower limit.
func atLeast(name, unit string, limit float64) func(get func(string, string) (Figure, bool)) (float64, float64, bool, bool) {
	return func(get func(string, string) (Figure, bool)) (float64, float64, bool, bool) {
		f, ok := get(name, unit)
		if !ok {
			return 0, 0, false, false
		}
		return f.Median, limit, f.Median >= limit, true
	}
}

// atLeastTimes judges name's median against factor × base's (same unit).
func atLeastTimes(name, base, unit string, factor float64) func(get func(string, string) (Figure, bool)) (float64, float64, bool, bool) {
	return func(get func(string, string) (Figure, bool)) (float64, float64, bool, bool) {
		f, ok1 := get(name, unit)
		b, ok2 := get(base, unit)
		if !ok1 || !ok2 {
			return 0, 0, false, false
		}
		limit := factor * b.Median
		return f.Median, limit, f.Median >= limit, true
	}
}

// atMostTimes judges name against factor times its baseline base (both of
// unit).
func atMostTimes(name, base, unit string, factor float64) func(get func(string, string) (Figure, bool)) (float64, float64, bool, bool) {
	return func(get func(string, string) (Figure, bool)) (float64, float64, bool, bool) {
		f, ok1 := get(name, unit)
		b, ok2 := get(base, unit)
		if !ok1 || !ok2 {
			return 0, 0, false, false
		}
		return f.Median, factor * b.Median, f.Median <= factor*b.Median, true
	}
}

func atMost(name, unit string, limit float64) func(get func(string, string) (Figure, bool)) (float64, float64, bool, bool) {
	return func(get func(string, string) (Figure, bool)) (float64, float64, bool, bool) {
		f, ok := get(name, unit)
		if !ok {
			return 0, 0, false, false
		}
		return f.Median, limit, f.Median <= limit, true
	}
}

// MarkRefused marks the figures taken at a load above maxLoad, and those
// whose baseline was, as refused.
func MarkRefused(figs []Figure, maxLoad float64) {
	refused := map[key]bool{}
	for i := range figs {
		if figs[i].Load > maxLoad {
			figs[i].Refused = true
			refused[key{figs[i].Package, figs[i].Name, figs[i].Unit}] = true
		}
	}
	for i := range figs {
		f := &figs[i]
		if f.Baseline != "" && refused[key{f.Package, f.Baseline, f.BaselineUnit}] {
			f.Refused = true
		}
	}
}

// TargetRow is one target as a report reads it.
type TargetRow struct {
	Target
	Found    bool
	Embark   Figure
	Value    float64
	Limit    float64
	Met      bool
	Refused  bool
	Load     float64
	Baseline string
}

// EvaluateTargets reads each target from figs.
func EvaluateTargets(figs []Figure, targets []Target) []TargetRow {
	var rows []TargetRow
	for _, t := range targets {
		row := TargetRow{Target: t}
		var used []Figure
		get := func(name, unit string) (Figure, bool) {
			for _, f := range figs {
				if strings.HasSuffix(f.Package, t.Package) && f.Name == name && f.Unit == unit {
					used = append(used, f)
					return f, true
				}
			}
			return Figure{}, false
		}
		get(t.Figure, t.Unit) // shown as Embark's figure even when Check judges another
		row.Value, row.Limit, row.Met, row.Found = t.Check(get)
		for _, f := range used {
			row.Load = math.Max(row.Load, f.Load)
			row.Refused = row.Refused || f.Refused
			if f.Name == t.Figure && f.Unit == t.Unit {
				row.Embark = f
			}
		}
		if row.Embark.Baseline != "" {
			row.Baseline = fmt.Sprintf("%s %s (%s)", Format(row.Embark.BaselineMedian), row.Embark.BaselineUnit, row.Embark.Baseline)
		}
		rows = append(rows, row)
	}
	return rows
}

// writeTargets writes the targets table: target, Embark, baseline, ratio,
// load and whether it is met; a figure taken above the maximum load is
// refused (its value is shown, struck through, and not judged).
func writeTargets(b *strings.Builder, rows []TargetRow, maxLoad float64) {
	b.WriteString("\n## Targets\n\n")
	fmt.Fprintf(b, "Figures taken at a load above %.1f (1-minute load average before the run, or, when anything else used the CPU during it, after it less the run's own CPU) are refused: run `make bench` again on an idle machine.\n\n", maxLoad)
	b.WriteString("| figure | target | Embark | baseline (same run) | ratio | load | met |\n")
	b.WriteString("| --- | --- | ---: | --- | ---: | ---: | --- |\n")
	for _, r := range rows {
		name := r.Figure + " (" + r.Unit + ")"
		if !r.Found {
			fmt.Fprintf(b, "| %s | %s | not measured | | | | — |\n", name, r.Text)
			continue
		}
		embark := Format(r.Embark.Median)
		if r.Value != r.Embark.Median {
			embark += " (" + Format(r.Value) + " judged)"
		}
		ratio := ""
		if r.Embark.Ratio != 0 {
			ratio = fmt.Sprintf("%.2f", r.Embark.Ratio)
		}
		met := "no"
		if r.Met {
			met = "yes"
		}
		met += fmt.Sprintf(" (limit %s)", Format(r.Limit))
		if r.Refused {
			embark, met = "~~"+embark+"~~", "refused: load above "+fmt.Sprintf("%.1f", maxLoad)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %.2f | %s |\n", name, r.Text, embark, r.Baseline, ratio, r.Load, met)
	}
}
