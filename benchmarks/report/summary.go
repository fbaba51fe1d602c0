package report

import (
	"cmp"
	"regexp"
	"slices"
	"strings"
)

// Figure is one figure aggregated over the runs of the report.
type Figure struct {
	Package string    `json:"package"`
	Name    string    `json:"name"`
	Unit    string    `json:"unit"`
	Values  []float64 `json:"values"`
	Median  float64   `json:"median"`
	Min     float64   `json:"min"`
	Max     float64   `json:"max"`
	// Spread is (Max-Min)/Median, 0 when Median is 0.
	Spread float64 `json:"spread"`
	// Procs is GOMAXPROCS of the runs (go test -bench output only).
	Procs int `json:"procs,omitempty"`
	// Baseline names the figure of the same package this one is compared
	// with; BaselineMedian is its median and Ratio Median/BaselineMedian.
	Baseline       string  `json:"baseline,omitempty"`
	BaselineUnit   string  `json:"baselineUnit,omitempty"`
	BaselineMedian float64 `json:"baselineMedian,omitempty"`
	Ratio          float64 `json:"ratio,omitempty"`
	Note           string  `json:"note,omitempty"`
	// Load is the highest load any of its runs was taken at (RunLoad.Load);
	// Refused says it (or its baseline) was above the report's MaxLoad.
	Load    float64 `json:"load,omitempty"`
	Refused bool    `json:"refused,omitempty"`
}

// Rule pairs figures of standard `go test -bench` output, which cannot name
// their baseline, with the baseline measured in the same run. Benchmarks
// that write benchjson name their baseline themselves.
type Rule struct {
	// Package is the import path's suffix, e.g. "benchmarks/onboarding".
	Package string
	// Name matches the figure's name; Baseline may refer to its groups
	// ($1).
	Name *regexp.Regexp
	// Unit of the figure; BaselineUnit of the baseline (default Unit).
	Unit, Baseline, BaselineUnit string
}

// Rules are the baselines of Embark's go-test benchmarks.
var Rules = []Rule{
	{Package: "benchmarks/onboarding", Name: regexp.MustCompile(`^Onboarding/agents=(\d+)$`), Unit: "onboardings/s",
		Baseline: "Onboarding/raw/clients=$1", BaselineUnit: "creates/s"},
	{Package: "benchmarks/authorize", Name: regexp.MustCompile(`^VerifyAndAuthorize$`), Unit: "ops/s/core",
		Baseline: "BaselineRSA2048Verify", BaselineUnit: "ops/s/core"},
	{Package: "benchmarks/authorize", Name: regexp.MustCompile(`^AuthorizeScale/document/policies=(\d+)$`), Unit: "ops/s/core",
		Baseline: "AuthorizeScale/document/policies=1"},
	{Package: "benchmarks/authorize", Name: regexp.MustCompile(`^AuthorizeScale/sts/policies=(\d+)$`), Unit: "ops/s/core",
		Baseline: "AuthorizeScale/document/policies=$1"},
	{Package: "benchmarks/identity", Name: regexp.MustCompile(`^(EC2|JWT)`), Unit: "verifications/s",
		Baseline: "BaselineRSA2048PKCS1v15Verify"},
}

type key struct{ pkg, name, unit string }

// Summarize aggregates results (several runs of the same figures) into
// figures, in the order they first appear, and pairs them with baselines:
// the Baseline of a benchjson Result, else the first matching Rule.
func Summarize(results []PackageResult, rules []Rule) []Figure {
	var order []key
	byKey := map[key]*Figure{}
	for _, r := range results {
		k := key{r.Package, r.Name, r.Unit}
		f, ok := byKey[k]
		if !ok {
			f = &Figure{Package: r.Package, Name: r.Name, Unit: r.Unit, Procs: r.Procs,
				Baseline: r.Baseline, BaselineUnit: r.BaselineUnit, Note: r.Note}
			if r.Baseline != "" && f.BaselineUnit == "" {
				f.BaselineUnit = r.Unit
			}
			byKey[k] = f
			order = append(order, k)
		}
		f.Values = append(f.Values, r.Value)
		f.Load = max(f.Load, r.Load)
		if r.BaselineValue != 0 && r.Baseline == "" {
			// A baseline measured inside the benchmark, without a
			// figure of its own: aggregate it as one.
			f.Baseline, f.BaselineUnit = r.Name+" (baseline)", r.Unit
			bk := key{r.Package, f.Baseline, r.Unit}
			b, ok := byKey[bk]
			if !ok {
				b = &Figure{Package: r.Package, Name: f.Baseline, Unit: r.Unit}
				byKey[bk] = b
				order = append(order, bk)
			}
			b.Values = append(b.Values, r.BaselineValue)
			b.Load = max(b.Load, r.Load)
		}
	}
	figs := make([]Figure, 0, len(order))
	for _, k := range order {
		f := byKey[k]
		f.Median, f.Min, f.Max = stats(f.Values)
		if f.Median != 0 {
			f.Spread = (f.Max - f.Min) / f.Median
		}
		if f.Baseline == "" {
			for _, rule := range rules {
				if !strings.HasSuffix(f.Package, rule.Package) || f.Unit != rule.Unit {
					continue
				}
				m := rule.Name.FindStringSubmatchIndex(f.Name)
				if m == nil {
					continue
				}
				f.Baseline = string(rule.Name.ExpandString(nil, rule.Baseline, f.Name, m))
				f.BaselineUnit = cmp.Or(rule.BaselineUnit, rule.Unit)
				break
			}
		}
	}
	for _, k := range order {
		f := byKey[k]
		if f.Baseline == "" {
			continue
		}
		b, ok := byKey[key{f.Package, f.Baseline, f.BaselineUnit}]
		if !ok || b == f {
			continue
		}
		b.Median, _, _ = stats(b.Values)
		f.BaselineMedian = b.Median
		if b.Median != 0 {
			f.Ratio = f.Median / b.Median
		}
	}
	for _, k := range order {
		figs = append(figs, *byKey[k])
	}
	return figs
}

// stats returns the median, minimum and maximum of vs.
func stats(vs []float64) (median, lo, hi float64) {
	if len(vs) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		median = s[n/2]
	} else {
		median = (s[n/2-1] + s[n/2]) / 2
	}
	return median, s[0], s[n-1]
}
