package report

import (
	"bytes"
	"strings"
	"testing"

	"github.com/embark-mesh/embark/benchmarks/benchjson"
)

const sample = `goos: linux
goarch: amd64
pkg: github.com/embark-mesh/embark/benchmarks/onboarding
cpu: Intel(R) Xeon(R) CPU @ 2.20GHz
BenchmarkOnboarding/agents=10-2         	     200	   5404535 ns/op	       185.0 onboardings/s	        53.70 p50-ms
BenchmarkOnboarding/agents=10-2         	     200	   5404535 ns/op	       175.0 onboardings/s	        50.00 p50-ms
BenchmarkOnboarding/agents=10-2         	     200	   5404535 ns/op	       200.0 onboardings/s	        60.00 p50-ms
BenchmarkOnboarding/raw/clients=10
    bench_test.go:12: a log line
BenchmarkOnboarding/raw/clients=10-2         	     200	   4000000 ns/op	       250.0 creates/s
BenchmarkOnboarding/raw/clients=10-2         	[controller-runtime] log.SetLogger(...) was never called
	>  goroutine 3532 [running]:
	     200	   4000000 ns/op	       300.0 creates/s
BenchmarkOnboarding/raw/clients=10-2         	     200	   4000000 ns/op	       350.0 creates/s
Benchmark log line that is not a result
PASS
ok  	github.com/embark-mesh/embark/benchmarks/onboarding	12.3s
`

func TestParseAndSummarize(t *testing.T) {
	out, err := ParseGoBench(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if out.CPU != "Intel(R) Xeon(R) CPU @ 2.20GHz" || out.Package != "github.com/embark-mesh/embark/benchmarks/onboarding" {
		t.Errorf("header: %+v", out)
	}
	if len(out.Results) != 3*3+3*2 {
		t.Fatalf("%d results, want 15: %+v", len(out.Results), out.Results)
	}
	if r := out.Results[0]; r.Name != "Onboarding/agents=10" || r.Procs != 2 || r.Runs != 200 || r.Unit != "ns/op" {
		t.Errorf("first result %+v", r)
	}
	figs := Summarize(out.Results, Rules)
	byName := map[string]Figure{}
	for _, f := range figs {
		byName[f.Name+" "+f.Unit] = f
	}
	on := byName["Onboarding/agents=10 onboardings/s"]
	if on.Median != 185 || on.Min != 175 || on.Max != 200 || on.Baseline != "Onboarding/raw/clients=10" || on.BaselineMedian != 300 {
		t.Errorf("onboarding figure %+v", on)
	}
	if want := 185.0 / 300; on.Ratio != want {
		t.Errorf("ratio %v, want %v", on.Ratio, want)
	}
	if p50 := byName["Onboarding/agents=10 p50-ms"]; p50.Median != 53.7 || p50.Baseline != "" {
		t.Errorf("p50 figure %+v", p50)
	}
}

func TestParseRejectsABadValue(t *testing.T) {
	_, err := ParseGoBench(strings.NewReader("BenchmarkX-2 10 abc ns/op\n"))
	if err == nil || !strings.Contains(err.Error(), `value "abc" of ns/op`) {
		t.Errorf("err = %v", err)
	}
}

func TestSummarizeBenchJSON(t *testing.T) {
	const pkg = "github.com/embark-mesh/embark/benchmarks/streams"
	var rs []PackageResult
	for _, v := range [][2]float64{{10, 4}, {12, 4}, {11, 5}} {
		rs = append(rs,
			PackageResult{Package: pkg, Result: benchjson.Result{Name: "Held/streams=1000", Unit: "KiB/stream", Value: v[0], Baseline: "Bare/streams=1000"}},
			PackageResult{Package: pkg, Result: benchjson.Result{Name: "Bare/streams=1000", Unit: "KiB/stream", Value: v[1]}},
			PackageResult{Package: pkg, Result: benchjson.Result{Name: "Disconnect", Unit: "s", Value: v[0] / 10, BaselineValue: v[1] / 10}},
		)
	}
	figs := Summarize(rs, nil)
	if len(figs) != 4 {
		t.Fatalf("figures %+v", figs)
	}
	if f := figs[0]; f.Median != 11 || f.BaselineMedian != 4 || f.Ratio != 11.0/4 || f.Spread != 2.0/11 {
		t.Errorf("held %+v", f)
	}
	if f := figs[2]; f.Baseline != "Disconnect (baseline)" || f.BaselineMedian != 0.4 || f.Ratio != 1.1/0.4 {
		t.Errorf("disconnect %+v", f)
	}
	rep := &Report{Count: 3, Command: "make bench", Packages: []PackageRun{{Package: pkg, Runs: 3, JSON: true}}, Figures: figs}
	var md bytes.Buffer
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if want := "| Held/streams=1000 | KiB/stream | 11 | 10 | 12 | 18% | Bare/streams=1000 | 4 | 2.75 |"; !strings.Contains(md.String(), want) {
		t.Errorf("markdown lacks %q:\n%s", want, md.String())
	}
}

func TestFormat(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 95.64: "95.6", 12345.6: "12346", 0.01234: "0.0123", 187: "187"} {
		if got := Format(v); got != want {
			t.Errorf("Format(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestTargetsAndRefusedFigures: a figure over the maximum load (or whose
// baseline is) is refused and not judged; the others are judged against
// their targets.
func TestTargetsAndRefusedFigures(t *testing.T) {
	const push, streams = "github.com/embark-mesh/embark/benchmarks/push", "github.com/embark-mesh/embark/benchmarks/streams"
	res := func(pkg, name, unit string, v, load float64, baseline string) PackageResult {
		return PackageResult{Package: pkg, Load: load, Result: benchjson.Result{Name: name, Unit: unit, Value: v, Baseline: baseline}}
	}
	results := []PackageResult{
		res(push, "SidecarChange/workloads=1000", "ms/push", 400, 1.2, "RawSnapshotFanOut/workloads=1000"),
		res(push, "SidecarChange/workloads=1000", "seen-ms/push", 380, 1.2, ""),
		res(push, "SidecarChange/workloads=1000", "debounce-ms", 100, 1.2, ""),
		res(push, "RawSnapshotFanOut/workloads=1000", "ms/push", 100, 1.2, ""),
		res(streams, "MassDisconnect/streams=1000", "s", 2, 1.5, ""),
		res(streams, "StormTime/streams=1000", "s", 30, 2.5, ""),
		res(streams, "Held/streams=10000", "B/stream", 20000, 1, "Bare/streams=10000"),
		res(streams, "Bare/streams=10000", "B/stream", 14000, 4.5, ""),
	}
	figs := Summarize(results, Rules)
	MarkRefused(figs, 3)
	rows := EvaluateTargets(figs, Targets)
	byFigure := map[string]TargetRow{}
	for _, r := range rows {
		byFigure[r.Figure+" "+r.Unit] = r
	}
	tests := []struct {
		name                            string
		figure                          string
		wantFound, wantMet, wantRefused bool
		wantValue, wantLimit            float64
	}{
		{name: "push judged from the change seen, after the debounce", figure: "SidecarChange/workloads=1000 ms/push", wantFound: true, wantMet: false, wantValue: 280, wantLimit: 150},
		{name: "met", figure: "MassDisconnect/streams=1000 s", wantFound: true, wantMet: true, wantValue: 2, wantLimit: 3},
		{name: "not met", figure: "StormTime/streams=1000 s", wantFound: true, wantValue: 30, wantLimit: 10},
		{name: "baseline refused", figure: "Held/streams=10000 B/stream", wantFound: true, wantRefused: true, wantValue: 20000, wantLimit: 1.3 * 14000},
		{name: "not measured", figure: "Onboarding/agents=50 onboardings/s"},
	}
	if got := byFigure["SidecarChange/workloads=1000 ms/push"].Embark.Median; got != 400 {
		t.Errorf("push row shows Embark %v, want its ms/push (400) beside the judged value", got)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, ok := byFigure[tt.figure]
			if !ok {
				t.Fatalf("no target row for %s", tt.figure)
			}
			if r.Found != tt.wantFound || r.Met != tt.wantMet || r.Refused != tt.wantRefused || r.Value != tt.wantValue || r.Limit != tt.wantLimit {
				t.Errorf("row found=%v met=%v refused=%v value=%v limit=%v, want %v %v %v %v %v", r.Found, r.Met, r.Refused, r.Value, r.Limit,
					tt.wantFound, tt.wantMet, tt.wantRefused, tt.wantValue, tt.wantLimit)
			}
		})
	}
	rep := &Report{Count: 1, MaxLoad: 3, Figures: figs, Packages: []PackageRun{{Package: streams, Runs: 1, Loads: []RunLoad{{Before: 4.5, After: 5, OwnCores: 1, Load: 4.5, Attempt: 2}}}}}
	var buf bytes.Buffer
	if err := rep.WriteMarkdown(&buf); err != nil {
		t.Fatal(err)
	}
	md := buf.String()
	for _, want := range []string{"## Targets", "refused: load above 3.0", "| MassDisconnect/streams=1000 (s) | ≤ 3 s | 2 |", "(second attempt)", "~~14000~~ refused"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

// TestFleetTargets: the burst is judged against 1.25 times its same-run
// bound, the relayed heap at 10,000 streams against istiod direct, the
// relay's added p99 as the difference of the two p99s, the large push
// against 1.25 times direct, the renewals by their failures and by their
// rate against 0.95 times direct.
func TestFleetTargets(t *testing.T) {
	const burst, relay = "github.com/embark-mesh/embark/benchmarks/burst", "github.com/embark-mesh/embark/benchmarks/relay"
	const s = "/streams=10000/per-conn=1"
	res := func(pkg, name, unit string, v float64) PackageResult {
		return PackageResult{Package: pkg, Load: 1, Result: benchjson.Result{Name: name, Unit: unit, Value: v}}
	}
	figs := Summarize([]PackageResult{
		res(burst, "Burst/vms=500", "s", 12), res(burst, "BurstBound/vms=500", "s", 10),
		res(relay, "RelayedServerHeap"+s, "B/stream", 30000), res(relay, "DirectServerHeap"+s, "B/stream", 31000),
		res(relay, "RelayedP99"+s, "ms", 20), res(relay, "DirectP99"+s, "ms", 14),
		res(relay, "LargePushRelayed"+s, "ms", 1300), res(relay, "LargePushDirect"+s, "ms", 1000),
		res(burst, "RenewalFailures/sidecars=1000", "renewals", 1),
		res(burst, "Renewals/sidecars=1000", "renewals/s", 39), res(burst, "RenewalsDirect/sidecars=1000", "renewals/s", 40),
	}, Rules)
	byFigure := map[string]TargetRow{}
	for _, r := range EvaluateTargets(figs, Targets) {
		byFigure[r.Figure+" "+r.Unit] = r
	}
	tests := []struct {
		figure               string
		wantMet              bool
		wantValue, wantLimit float64
	}{
		{figure: "Burst/vms=500 s", wantMet: true, wantValue: 12, wantLimit: 12.5},
		{figure: "RelayedServerHeap" + s + " B/stream", wantMet: true, wantValue: 30000, wantLimit: 31000},
		{figure: "RelayedP99" + s + " ms", wantMet: false, wantValue: 6, wantLimit: 5},
		{figure: "LargePushRelayed" + s + " ms", wantMet: false, wantValue: 1300, wantLimit: 1250},
		{figure: "RenewalFailures/sidecars=1000 renewals", wantMet: false, wantValue: 1, wantLimit: 0},
		{figure: "Renewals/sidecars=1000 renewals/s", wantMet: true, wantValue: 39, wantLimit: 38},
	}
	for _, tt := range tests {
		t.Run(tt.figure, func(t *testing.T) {
			r, ok := byFigure[tt.figure]
			if !ok {
				t.Fatalf("no target row for %s", tt.figure)
			}
			if !r.Found || r.Met != tt.wantMet || r.Value != tt.wantValue || r.Limit != tt.wantLimit {
				t.Errorf("row found=%v met=%v value=%v limit=%v, want met %v value %v limit %v", r.Found, r.Met, r.Value, r.Limit, tt.wantMet, tt.wantValue, tt.wantLimit)
			}
		})
	}
}

// The machine line warns of a busy machine by the load when the runs
// began, not by the end's, which is mostly the last run's own.
func TestBusyMachineWarning(t *testing.T) {
	tests := []struct {
		name       string
		start, end float64
		want       bool
	}{
		{name: "idle, the last run's own load at the end", start: 0.5, end: 2.7},
		{name: "busy from the start", start: 3.5, end: 2.0, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := &Report{Count: 1, Command: "make bench", Machine: Machine{CPUs: 2, LoadAverageStart: tt.start, LoadAverageEnd: tt.end}}
			var md bytes.Buffer
			if err := rep.WriteMarkdown(&md); err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(md.String(), "busier than its CPUs"); got != tt.want {
				t.Errorf("warning shown = %v, want %v:\n%s", got, tt.want, md.String())
			}
		})
	}
}

// The policy-scale targets judge the document path with 1,000 policies
// against its absolute floor and against the 1 matching policy alone, and
// the STS-proof path against the document path.
func TestAuthorizeScaleTargets(t *testing.T) {
	const pkg = "github.com/embark-mesh/embark/benchmarks/authorize"
	res := func(name string, v float64) PackageResult {
		return PackageResult{Package: pkg, Load: 1, Result: benchjson.Result{Name: name, Unit: "ops/s/core", Value: v}}
	}
	figs := Summarize([]PackageResult{
		res("AuthorizeScale/document/policies=1", 10000),
		res("AuthorizeScale/document/policies=1000", 9800),
		res("AuthorizeScale/sts/policies=1000", 4000),
	}, Rules)
	byText := map[string]TargetRow{}
	for _, r := range EvaluateTargets(figs, Targets) {
		if strings.HasSuffix(r.Package, "benchmarks/authorize") {
			byText[r.Text] = r
		}
	}
	tests := []struct {
		text                 string
		wantMet              bool
		wantValue, wantLimit float64
	}{
		{text: "≥ 12,000 verifications + decisions/s per core with 1,000 policies (document path)", wantValue: 9800, wantLimit: 12000},
		{text: "≥ 0.9 × the same with the 1 matching policy alone (independent of unrelated policies)", wantMet: true, wantValue: 9800, wantLimit: 9000},
		{text: "≥ 0.5 × the document path with 1,000 policies (STS-proof path)", wantValue: 4000, wantLimit: 4900},
	}
	for _, tt := range tests {
		r, ok := byText[tt.text]
		if !ok {
			t.Fatalf("no target row %q", tt.text)
		}
		if !r.Found || r.Met != tt.wantMet || r.Value != tt.wantValue || r.Limit != tt.wantLimit {
			t.Errorf("%s: found=%v met=%v value=%v limit=%v, want met=%v value=%v limit=%v", tt.text, r.Found, r.Met, r.Value, r.Limit, tt.wantMet, tt.wantValue, tt.wantLimit)
		}
	}
	for _, f := range figs {
		if f.Name == "AuthorizeScale/document/policies=1000" && (f.Baseline != "AuthorizeScale/document/policies=1" || f.Ratio != 0.98) {
			t.Errorf("document/policies=1000 baseline %q ratio %v, want the 1-policy case and 0.98", f.Baseline, f.Ratio)
		}
	}
}

// An onboarding's p99 is judged against twice the raw creates' p99 of the
// same concurrency, at 10 and at 50 agents.
func TestOnboardingLatencyTargets(t *testing.T) {
	const pkg = "github.com/embark-mesh/embark/benchmarks/onboarding"
	res := func(name string, v float64) PackageResult {
		return PackageResult{Package: pkg, Load: 1, Result: benchjson.Result{Name: name, Unit: "p99-ms", Value: v}}
	}
	figs := Summarize([]PackageResult{
		res("Onboarding/agents=10", 250), res("Onboarding/raw/clients=10", 140),
		res("Onboarding/agents=50", 1172), res("Onboarding/raw/clients=50", 490),
	}, Rules)
	want := map[string]struct {
		met          bool
		value, limit float64
	}{
		"Onboarding/agents=10": {true, 250, 280},
		"Onboarding/agents=50": {false, 1172, 980},
	}
	seen := 0
	for _, r := range EvaluateTargets(figs, Targets) {
		w, ok := want[r.Figure]
		if !ok || r.Unit != "p99-ms" {
			continue
		}
		seen++
		if !r.Found || r.Met != w.met || r.Value != w.value || r.Limit != w.limit {
			t.Errorf("%s: found=%v met=%v value=%v limit=%v, want met=%v value=%v limit=%v", r.Figure, r.Found, r.Met, r.Value, r.Limit, w.met, w.value, w.limit)
		}
	}
	if seen != len(want) {
		t.Errorf("%d p99 target rows for onboarding, want %d", seen, len(want))
	}
}

func TestJudgedLoad(t *testing.T) {
	for _, tc := range []struct {
		name string
		load RunLoad
		want float64
	}{
		{"idle machine, a run ending in its heaviest phase", RunLoad{Before: 1.2, After: 5.5, OwnCores: 1.75, OtherCores: 0}, 1.2},
		{"idle machine, even run", RunLoad{Before: 0.5, After: 1.5, OwnCores: 1.2, OtherCores: 0.05}, 0.5},
		{"another job during the run", RunLoad{Before: 1.2, After: 5.5, OwnCores: 1.0, OtherCores: 0.8}, 4.5},
		{"busy before the run", RunLoad{Before: 4, After: 2, OwnCores: 1, OtherCores: 0}, 4},
		{"other work, but the load after is the run's own", RunLoad{Before: 2, After: 2.5, OwnCores: 1.5, OtherCores: 0.3}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := judgedLoad(tc.load); got != tc.want {
				t.Fatalf("judgedLoad(%+v) = %v, want %v", tc.load, got, tc.want)
			}
		})
	}
}
