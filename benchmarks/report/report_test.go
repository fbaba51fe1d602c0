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
BenchmarkRawCreate/clients=10
    bench_test.go:12: a log line
BenchmarkRawCreate/clients=10-2         	     200	   4000000 ns/op	       250.0 creates/s
BenchmarkRawCreate/clients=10-2         	[controller-runtime] log.SetLogger(...) was never called
	>  goroutine 3532 [running]:
	     200	   4000000 ns/op	       300.0 creates/s
BenchmarkRawCreate/clients=10-2         	     200	   4000000 ns/op	       350.0 creates/s
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
	if on.Median != 185 || on.Min != 175 || on.Max != 200 || on.Baseline != "RawCreate/clients=10" || on.BaselineMedian != 300 {
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
