package manifests

import (
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/servingcert"
	"github.com/embark-mesh/embark/onboarding/endpoint"
	"github.com/embark-mesh/embark/onboarding/repository/signing"
	"github.com/embark-mesh/embark/registry/lifecycle"
	"github.com/embark-mesh/embark/registry/presence"
	"github.com/embark-mesh/embark/version"
	"github.com/embark-mesh/embark/xds"
	"github.com/embark-mesh/embark/xds/ca"
	"github.com/embark-mesh/embark/xds/configsource"
	"github.com/embark-mesh/embark/xds/relay"
	"github.com/embark-mesh/embark/xds/upstream"
)

// exportedMetrics registers every metric Embark exports, through the real
// constructors the endpoint's main calls. Add new metrics constructors
// here: the lint, dashboard and alert tests read this one list.
// reader serves the collectors that count objects (the real API server in
// these tests).
func exportedMetrics(reg prometheus.Registerer, reader client.Reader) error {
	if _, err := endpoint.NewMetrics(reg); err != nil {
		return fmt.Errorf("onboarding API metrics: %w", err)
	}
	if _, err := presence.NewConnectionMetrics(reg); err != nil {
		return fmt.Errorf("connection metrics: %w", err)
	}
	if _, err := lifecycle.NewMetrics(reg); err != nil {
		return fmt.Errorf("lifecycle metrics: %w", err)
	}
	if _, err := presence.NewHealthMetrics(reg, reader); err != nil {
		return fmt.Errorf("health metrics: %w", err)
	}
	if _, err := configsource.NewMetrics(reg); err != nil {
		return fmt.Errorf("xDS configuration metrics: %w", err)
	}
	if _, err := xds.NewNACKMetrics(reg); err != nil {
		return fmt.Errorf("xDS NACK metrics: %w", err)
	}
	if _, err := xds.NewMetrics(reg); err != nil {
		return fmt.Errorf("xDS stream metrics: %w", err)
	}
	if _, err := ca.NewMetrics(reg); err != nil {
		return fmt.Errorf("certificate relay metrics: %w", err)
	}
	if _, err := relay.NewMetrics(reg); err != nil {
		return fmt.Errorf("xDS relay metrics: %w", err)
	}
	if _, err := upstream.NewMetrics(reg); err != nil {
		return fmt.Errorf("istiod connection metrics: %w", err)
	}
	// The expiry collectors report the current certificate or key, read at
	// each scrape: a certificate here, no signer (a key without expiry).
	if err := servingcert.RegisterExpiry(reg, func() *x509.Certificate { return &x509.Certificate{NotAfter: time.Now()} }); err != nil {
		return fmt.Errorf("serving certificate metrics: %w", err)
	}
	if err := signing.RegisterExpiry(reg, func() *signing.Signer { return nil }); err != nil {
		return fmt.Errorf("repository signing key metrics: %w", err)
	}
	return version.Register(reg)
}

// runtimeNames are the Go runtime and process metrics the endpoint
// exports besides Embark's (app.Run registers the same collectors), and
// Prometheus' synthetic up: what the dashboard's process-health panels use.
func runtimeNames(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{"up": true}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	return names
}

// capture keeps the collectors registered, to give every vector a child:
// a vector without children gathers nothing.
type capture struct {
	*prometheus.Registry
	collectors []prometheus.Collector
}

func (c *capture) Register(col prometheus.Collector) error {
	c.collectors = append(c.collectors, col)
	return c.Registry.Register(col)
}

func (c *capture) MustRegister(cols ...prometheus.Collector) {
	for _, col := range cols {
		if err := c.Register(col); err != nil {
			panic(err)
		}
	}
}

// gathered returns the metric families of exportedMetrics, each vector
// with one child.
func gathered(t *testing.T) *capture {
	t.Helper()
	c := &capture{Registry: prometheus.NewRegistry()}
	if err := exportedMetrics(c, env.Client); err != nil {
		t.Fatal(err)
	}
	for _, col := range c.collectors {
		touch(t, col)
	}
	return c
}

// touch creates one child of a vector with as many label values as it has
// labels (tried from 0 up: the cardinality is not exported).
func touch(t *testing.T, col prometheus.Collector) {
	t.Helper()
	for n := 0; n <= 6; n++ {
		values := make([]string, n)
		for i := range values {
			values[i] = "x"
		}
		var err error
		switch v := col.(type) {
		case *prometheus.CounterVec:
			_, err = v.GetMetricWithLabelValues(values...)
		case *prometheus.GaugeVec:
			_, err = v.GetMetricWithLabelValues(values...)
		case *prometheus.HistogramVec:
			_, err = v.GetMetricWithLabelValues(values...)
		case *prometheus.SummaryVec:
			_, err = v.GetMetricWithLabelValues(values...)
		default:
			return // not a vector: it gathers by itself
		}
		if err == nil {
			return
		}
	}
	t.Fatalf("no label cardinality up to 6 fits %T", col)
}

// exportedNames are the series names Embark exports, with the _bucket,
// _sum and _count series of histograms and summaries.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	c := gathered(t)
	mfs, err := c.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	descs := make(chan *prometheus.Desc, 64)
	go func() {
		for _, col := range c.collectors {
			col.Describe(descs)
		}
		close(descs)
	}()
	for d := range descs {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			names[m[1]] = true
		}
	}
	for n := range runtimeNames(t) {
		names[n] = true
	}
	for _, mf := range mfs {
		names[mf.GetName()] = true
		switch mf.GetType().String() {
		case "HISTOGRAM":
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[mf.GetName()+s] = true
			}
		case "SUMMARY":
			for _, s := range []string{"_sum", "_count"} {
				names[mf.GetName()+s] = true
			}
		}
	}
	return names
}

// Every metric Embark registers passes promlint (promtool check metrics)
// and carries the embark_ prefix.
func TestMetricsPassPromlint(t *testing.T) {
	mfs, err := gathered(t).Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) < 12 {
		t.Errorf("only %d metric families gathered", len(mfs))
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "embark_") {
			t.Errorf("metric %s lacks the embark_ prefix", mf.GetName())
		}
	}
}

// promql parses expr, with Grafana's variables replaced by values, and
// returns the metric names it selects.
func promqlMetrics(expr string) ([]string, error) {
	for k, v := range map[string]string{"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "${namespace}": ".*", "$namespace": ".*"} {
		expr = strings.ReplaceAll(expr, k, v)
	}
	if strings.Contains(expr, "$") && !strings.Contains(expr, "{{") {
		return nil, fmt.Errorf("unreplaced variable in %q", expr)
	}
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == "__name__" {
					name = m.Value
				}
			}
			names = append(names, name)
		}
		return nil
	})
	if len(names) == 0 {
		return nil, fmt.Errorf("%q selects no metric", expr)
	}
	return names, nil
}

type dashboard struct {
	Panels []struct {
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			Expr         string `json:"expr"`
			LegendFormat string `json:"legendFormat"`
		} `json:"targets"`
		FieldConfig struct {
			Defaults struct {
				Unit string `json:"unit"`
			} `json:"defaults"`
		} `json:"fieldConfig"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// fqName finds a metric's name in a *prometheus.Desc's String (collectors
// that emit only for existing objects gather nothing in an empty cluster).
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

var labelValues = regexp.MustCompile(`^label_values\((.+),\s*\w+\)$`)

// Every query of the Grafana dashboard parses as PromQL and names only
// metrics Embark exports; together they cover connected workloads,
// onboarding rate and latency, denials, disconnects and removals.
func TestDashboardQueriesNameExportedMetrics(t *testing.T) {
	data, err := os.ReadFile("monitoring/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	exported := exportedNames(t)
	used := map[string]bool{}
	queries := 0
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			queries++
			names, err := promqlMetrics(tg.Expr)
			if err != nil {
				t.Errorf("panel %q: %v", p.Title, err)
				continue
			}
			for _, n := range names {
				used[n] = true
				if !exported[n] {
					t.Errorf("panel %q queries %s, which Embark does not export", p.Title, n)
				}
			}
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)
		s, _ := q["query"].(string)
		m := labelValues.FindStringSubmatch(s)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(<selector>, <label>)", v.Name, s)
			continue
		}
		names, err := promqlMetrics(m[1])
		if err != nil {
			t.Errorf("variable %s: %v", v.Name, err)
		}
		for _, n := range names {
			if !exported[n] {
				t.Errorf("variable %s queries %s, which Embark does not export", v.Name, n)
			}
		}
	}
	if queries == 0 {
		t.Fatal("dashboard has no queries")
	}
	for _, want := range []string{
		"embark_xds_connected_workloads", "embark_onboarding_requests_total", "embark_onboarding_request_duration_seconds_bucket",
		"embark_onboarding_denials_total", "embark_xds_disconnects_total", "embark_registry_grace_period_removals_total",
		// push and translation latency, time to first healthy, process health
		"embark_xds_config_push_seconds_bucket", "embark_xds_config_translation_seconds_bucket",
		"embark_registry_health_time_to_first_healthy_seconds_bucket", "process_resident_memory_bytes",
		"process_cpu_seconds_total", "go_goroutines", "process_start_time_seconds", "up",
		// istiod mode: the relays, the connection to istiod, expiry
		"embark_istiod_connection_state", "embark_xds_relay_streams", "embark_xds_relay_upstream_streams",
		"embark_xds_relay_upstream_errors_total", "embark_xds_relay_resyncs_total", "embark_xds_relay_pushes_total",
		"embark_xds_relay_push_added_seconds_bucket", "embark_ca_requests_total", "embark_ca_refusals_total",
		"embark_ca_istiod_failures_total", "embark_ca_request_duration_seconds_bucket", "embark_ca_istiod_request_duration_seconds_bucket",
		"embark_serving_certificate_expiry_timestamp_seconds", "embark_istiod_root_expiry_timestamp_seconds",
		"embark_repository_signing_key_expiry_timestamp_seconds",
	} {
		if !used[want] {
			t.Errorf("dashboard does not show %s", want)
		}
	}
	var unused []string
	for n := range exported {
		if !used[n] && !strings.HasSuffix(n, "_sum") && !strings.HasSuffix(n, "_count") && !exported[n+"_bucket"] {
			unused = append(unused, n)
		}
	}
	sort.Strings(unused)
	if len(unused) > 0 {
		t.Logf("exported metrics no panel shows: %v", unused)
	}
}

// Every alert expression parses and names only metrics Embark exports.
func TestAlertExpressionsNameExportedMetrics(t *testing.T) {
	_, objs := build(t, "monitoring")
	rule := mustFind(t, objs, "PrometheusRule", "embark")
	exported := exportedNames(t)
	groups := rule.Object["spec"].(map[string]any)["groups"].([]any)
	alerts := 0
	for _, g := range groups {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			r := r.(map[string]any)
			alerts++
			expr, _ := r["expr"].(string)
			names, err := promqlMetrics(expr)
			if err != nil {
				t.Errorf("alert %v: %v", r["alert"], err)
				continue
			}
			for _, n := range names {
				if !exported[n] {
					t.Errorf("alert %v uses %s, which Embark does not export", r["alert"], n)
				}
			}
			if ann, _ := r["annotations"].(map[string]any); ann["summary"] == nil || ann["description"] == nil {
				t.Errorf("alert %v lacks a summary or description", r["alert"])
			}
			if lbl, _ := r["labels"].(map[string]any); !slices.Contains([]any{"critical", "warning", "info"}, lbl["severity"]) {
				t.Errorf("alert %v severity %v", r["alert"], lbl["severity"])
			}
		}
	}
	if alerts == 0 {
		t.Fatal("no alerts")
	}
}

// The check can fail: a query of a metric Embark does not export, or one
// that is not PromQL, is caught.
func TestPromQLCheckCatchesMistakes(t *testing.T) {
	exported := exportedNames(t)
	names, err := promqlMetrics(`sum(rate(embark_onboarding_request_total[$__rate_interval]))`)
	if err != nil {
		t.Fatal(err)
	}
	if exported[names[0]] {
		t.Errorf("%s (singular) is reported as exported", names[0])
	}
	if _, err := promqlMetrics(`sum(rate(embark_onboarding_requests_total[5m])`); err == nil {
		t.Error("an unbalanced parenthesis parsed")
	}
	if _, err := promqlMetrics(`sum(rate(embark_onboarding_requests_total{namespace=~"$group"}[5m]))`); err == nil {
		t.Error("an unknown Grafana variable passed")
	}
}
