package manifests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/relabel"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"k8s.io/apimachinery/pkg/util/wait"
	sigsyaml "sigs.k8s.io/yaml"
)

// operatorRelabeling is what the Prometheus Operator (v0.8x) generates for
// an endpoint of a ServiceMonitor (monitoring/servicemonitor.yaml: port
// http-metrics of Service onboarding-endpoint-metrics): the target labels
// namespace, service, pod, container, endpoint and job from the
// Kubernetes service discovery's __meta labels. honorLabels is false, so
// a scraped label of the same name as a target label is renamed to
// exported_<name> (Prometheus' scrape rule, done by mergeTarget).
const operatorRelabeling = `
- source_labels: [job]
  target_label: __tmp_prometheus_job_name
- action: keep
  source_labels: [__meta_kubernetes_service_label_app_kubernetes_io_name]
  regex: onboarding-endpoint
- action: keep
  source_labels: [__meta_kubernetes_endpoint_port_name]
  regex: http-metrics
- source_labels: [__meta_kubernetes_namespace]
  target_label: namespace
- source_labels: [__meta_kubernetes_service_name]
  target_label: service
- source_labels: [__meta_kubernetes_pod_name]
  target_label: pod
- source_labels: [__meta_kubernetes_pod_container_name]
  target_label: container
- source_labels: [__meta_kubernetes_service_name]
  target_label: job
  replacement: ${1}
- target_label: endpoint
  replacement: http-metrics
- source_labels: [__address__]
  target_label: instance
`

// scrapeTarget is one replica as Kubernetes service discovery sees it.
type scrapeTarget struct {
	pod, addr string
}

// targetLabels runs the operator's relabelling on the discovered labels of
// t and returns the target labels (without __ labels).
func targetLabels(t *testing.T, tg scrapeTarget) labels.Labels {
	t.Helper()
	var cfgs []*relabel.Config
	if err := sigsyaml.Unmarshal([]byte(operatorRelabeling), &cfgs); err != nil {
		t.Fatal(err)
	}
	for _, c := range cfgs {
		if c.Regex.Regexp == nil {
			c.Regex = relabel.MustNewRegexp("(.*)")
		}
		if c.Action == "" {
			c.Action = relabel.Replace
		}
		if c.Separator == "" {
			c.Separator = ";"
		}
		if c.Replacement == "" {
			c.Replacement = "$1"
		}
		c.NameValidationScheme = model.UTF8Validation
		if err := c.Validate(model.UTF8Validation); err != nil {
			t.Fatalf("relabel config: %v", err)
		}
	}
	b := labels.NewBuilder(labels.FromStrings(
		"job", "serviceMonitor/istio-system/onboarding-endpoint/0",
		"__address__", tg.addr,
		"__meta_kubernetes_namespace", "istio-system",
		"__meta_kubernetes_service_name", "onboarding-endpoint-metrics",
		"__meta_kubernetes_service_label_app_kubernetes_io_name", "onboarding-endpoint",
		"__meta_kubernetes_endpoint_port_name", "http-metrics",
		"__meta_kubernetes_pod_name", tg.pod,
		"__meta_kubernetes_pod_container_name", "onboarding-endpoint",
	))
	if !relabel.ProcessBuilder(b, cfgs...) {
		t.Fatalf("the ServiceMonitor's relabelling drops target %s", tg.pod)
	}
	out := labels.NewBuilder(labels.EmptyLabels())
	b.Labels().Range(func(l labels.Label) {
		if !strings.HasPrefix(l.Name, "__") {
			out.Set(l.Name, l.Value)
		}
	})
	return out.Labels()
}

// mergeTarget adds the target labels to a scraped series as Prometheus does
// with honor_labels false: a scraped label clashing with a target label is
// kept as exported_<name>.
func mergeTarget(series, target labels.Labels) labels.Labels {
	b := labels.NewBuilder(series)
	target.Range(func(l labels.Label) {
		if v := series.Get(l.Name); v != "" {
			b.Set(model.ExportedLabelPrefix+l.Name, v)
		}
		b.Set(l.Name, l.Value)
	})
	return b.Labels()
}

// scrape reads a replica's /metrics and appends every sample, with the
// target labels, to app at ts; it also appends up=1.
func scrape(t *testing.T, app storage.Appender, tg scrapeTarget, ts time.Time) {
	t.Helper()
	appendFamilies(t, app, fetch(t, tg), targetLabels(t, tg), ts)
}

// families are the metric families of one scrape, by name.
type families map[string]*dto.MetricFamily

// fetch reads and parses a replica's /metrics.
func fetch(t *testing.T, tg scrapeTarget) families {
	t.Helper()
	resp, err := http.Get("http://" + tg.addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", tg.pod, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse %s's metrics: %v", tg.pod, err)
	}
	return fams
}

// appendFamilies appends every sample of fams, with the target labels, to
// app at ts, as Prometheus' scrape loop stores them; it also appends up=1.
func appendFamilies(t *testing.T, app storage.Appender, fams families, target labels.Labels, ts time.Time) {
	t.Helper()
	ms := ts.UnixMilli()
	add := func(name string, ls []*dto.LabelPair, extra []string, v float64) {
		kv := []string{"__name__", name}
		for _, l := range ls {
			kv = append(kv, l.GetName(), l.GetValue())
		}
		kv = append(kv, extra...)
		if _, err := app.Append(0, mergeTarget(labels.FromStrings(kv...), target), ms, v); err != nil {
			t.Fatalf("append %s: %v", name, err)
		}
	}
	add("up", nil, nil, 1)
	for name, mf := range fams {
		for _, m := range mf.GetMetric() {
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				add(name, m.GetLabel(), nil, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add(name, m.GetLabel(), nil, m.GetGauge().GetValue())
			case dto.MetricType_UNTYPED:
				add(name, m.GetLabel(), nil, m.GetUntyped().GetValue())
			case dto.MetricType_SUMMARY:
				add(name+"_sum", m.GetLabel(), nil, m.GetSummary().GetSampleSum())
				add(name+"_count", m.GetLabel(), nil, float64(m.GetSummary().GetSampleCount()))
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					add(name+"_bucket", m.GetLabel(), []string{"le", fmt.Sprint(b.GetUpperBound())}, float64(b.GetCumulativeCount()))
				}
				add(name+"_bucket", m.GetLabel(), []string{"le", "+Inf"}, float64(h.GetSampleCount()))
				add(name+"_sum", m.GetLabel(), nil, h.GetSampleSum())
				add(name+"_count", m.GetLabel(), nil, float64(h.GetSampleCount()))
			}
		}
	}
}

// promDB is a real Prometheus TSDB with the promql engine over it.
type promDB struct {
	db     *tsdb.DB
	engine *promql.Engine
}

func newPromDB(t *testing.T) *promDB {
	t.Helper()
	db, err := tsdb.Open(t.TempDir(), nil, nil, tsdb.DefaultOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return &promDB{db: db, engine: promql.NewEngine(promql.EngineOpts{
		MaxSamples: 1e6, Timeout: time.Minute, LookbackDelta: 5 * time.Minute,
	})}
}

// query evaluates expr at ts.
func (p *promDB) query(t *testing.T, expr string, ts time.Time) promql.Vector {
	t.Helper()
	q, err := p.engine.NewInstantQuery(t.Context(), p.db, nil, expr, ts)
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	defer q.Close()
	res := q.Exec(t.Context())
	if res.Err != nil {
		t.Fatalf("%s: %v", expr, res.Err)
	}
	switch v := res.Value.(type) {
	case promql.Vector:
		return v
	case promql.Scalar:
		return promql.Vector{{F: v.V}}
	default:
		t.Fatalf("%s: unexpected result %T", expr, res.Value)
		return nil
	}
}

// grafanaExpr replaces the dashboard's variables with what Grafana sends.
func grafanaExpr(expr string) string {
	for k, v := range map[string]string{"$__rate_interval": "2m", "$__interval": "30s", "$__range": "10m", "${namespace}": ".*", "$namespace": ".*"} {
		expr = strings.ReplaceAll(expr, k, v)
	}
	return expr
}

// replicas are two real endpoint replicas (app.Run) of one installation,
// sharing the API server, with one sweeper leader elected.
type replicas struct {
	host    string
	fixture *workloadFixture
	addrs   []endpointAddrs
	targets []scrapeTarget
	dones   []<-chan error
}

// startReplicas starts two endpoint replicas until ctx ends and waits for
// one of them to lead the sweeper; each of extra changes their
// configuration.
func startReplicas(t *testing.T, ctx context.Context, extra ...func(*config.Configuration)) *replicas {
	t.Helper()
	rs := &replicas{host: "onboarding-endpoint.example.corp", fixture: newWorkloadFixture(t)}
	endpointNS := env.Namespace(t) // the replicas' Leases and signing key
	for _, pod := range []string{"onboarding-endpoint-a", "onboarding-endpoint-b"} {
		a := newEndpointAddrs(t)
		rs.addrs = append(rs.addrs, a)
		rs.dones = append(rs.dones, runEndpoint(t, ctx, writeEndpointConfig(t, endpointNS, rs.host, rs.fixture, a, extra...), env.KubeconfigPath, pod))
		rs.targets = append(rs.targets, scrapeTarget{pod: pod, addr: a.metrics})
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return rs.leaders(t) == 1, nil
	}); err != nil {
		t.Fatalf("no single sweeper leader among the replicas: %d", rs.leaders(t))
	}
	return rs
}

// leaders counts the replicas reporting embark_registry_sweeper_leader 1.
func (rs *replicas) leaders(t *testing.T) int {
	t.Helper()
	n := 0
	for _, tg := range rs.targets {
		if metricValue(t, tg.addr, "embark_registry_sweeper_leader") == 1 {
			n++
		}
	}
	return n
}

// leader is the sweeper leader's target and the other replica's.
func (rs *replicas) leader(t *testing.T) (leader, other scrapeTarget) {
	t.Helper()
	if metricValue(t, rs.targets[0].addr, "embark_registry_sweeper_leader") == 1 {
		return rs.targets[0], rs.targets[1]
	}
	return rs.targets[1], rs.targets[0]
}

// waitWorkload waits until a replica (the leader) reports the onboarded
// workload in embark_registry_workloads.
func (rs *replicas) waitWorkload(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		total := 0.0
		for _, tg := range rs.targets {
			total += metricValue(t, tg.addr, "embark_registry_workloads")
		}
		return total >= 1, nil
	}); err != nil {
		t.Fatal("no replica reported embark_registry_workloads")
	}
}

// stop ends the replicas (cancel ends their context) and waits for them.
func (rs *replicas) stop(t *testing.T, cancel context.CancelFunc) {
	t.Helper()
	cancel()
	for _, done := range rs.dones {
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Error("a replica did not stop")
		}
	}
}

// Two real endpoint replicas and one onboarded workload, scraped through the Prometheus Operator's
// relabelling into a real TSDB: the fleet gauge counts each workload once
// (only the sweeper leader reports it), the workloads' namespace survives
// the operator's namespace target label, every dashboard and alert query
// evaluates, and no alert fires on a healthy installation.
func TestMonitoringCountsWithTwoReplicas(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	rs := startReplicas(t, ctx)
	f, targets := rs.fixture, rs.targets
	onboard(t, ctx, rs.addrs[0].onboarding, rs.host, f, "172.31.5.254")
	rs.waitWorkload(t, ctx)

	p := newPromDB(t)
	start := time.Now().Add(-10 * time.Minute).Truncate(time.Second)
	var now time.Time
	for i := 0; i < 21; i++ { // 10 minutes of 30s scrapes of the same state
		now = start.Add(time.Duration(i) * 30 * time.Second)
		app := p.db.Appender(ctx)
		for _, tg := range targets {
			scrape(t, app, tg, now)
		}
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
	}

	tests := []struct {
		name string
		expr string
		want map[string]float64 // result labels (formatted) -> value
	}{
		// Other tests of this package share the API server and leave
		// workloads of their own namespaces: count this test's namespace.
		{name: "fleet gauge counted once with two replicas", expr: fmt.Sprintf(`sum(embark_registry_workloads{workload_namespace=%q})`, f.ns), want: map[string]float64{"{}": 1}},
		{name: "workloads keep their namespace", expr: fmt.Sprintf(`sum by (workload_namespace, namespace) (embark_registry_workloads{workload_namespace=%q})`, f.ns),
			want: map[string]float64{fmt.Sprintf(`{namespace="istio-system", workload_namespace=%q}`, f.ns): 1}},
		{name: "no label was renamed by the operator", expr: `count({__name__=~"embark_.+", exported_namespace!=""}) or vector(0)`, want: map[string]float64{"{}": 0}},
		{name: "build info from each replica", expr: `count(embark_build_info) by (namespace)`, want: map[string]float64{`{namespace="istio-system"}`: 2}},
		{name: "one leader", expr: `sum(embark_registry_sweeper_leader)`, want: map[string]float64{"{}": 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string]float64{}
			for _, s := range p.query(t, tc.expr, now) {
				got[s.Metric.String()] = s.F
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("%s = %v, want %v", tc.expr, got, tc.want)
			}
		})
	}

	// The fleet gauge comes from the sweeper leader only.
	leader := ""
	for _, tg := range targets {
		if metricValue(t, tg.addr, "embark_registry_sweeper_leader") == 1 {
			leader = tg.pod
		}
	}
	for _, s := range p.query(t, `count by (pod) (embark_registry_workloads)`, now) {
		if pod := s.Metric.Get("pod"); pod != leader {
			t.Errorf("embark_registry_workloads from %s, which is not the sweeper leader %s", pod, leader)
		}
	}

	// Every dashboard query evaluates on the scraped data; the panels the
	// issue names return series.
	data, err := os.ReadFile("monitoring/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	mustShow := map[string]bool{"Workloads by health": true, "Replicas up and version": true, "Replica memory": true,
		"Replica CPU": true, "Replica goroutines and restarts": true, "Onboarding requests": true, "Registrations": true}
	for _, panel := range d.Panels {
		nonEmpty := false
		for _, tg := range panel.Targets {
			if len(p.query(t, grafanaExpr(tg.Expr), now)) > 0 {
				nonEmpty = true
			}
		}
		if mustShow[panel.Title] && !nonEmpty {
			t.Errorf("panel %q shows nothing on two replicas with a workload", panel.Title)
		}
		delete(mustShow, panel.Title)
	}
	for title := range mustShow {
		t.Errorf("dashboard has no panel %q", title)
	}
	for _, panel := range d.Panels {
		if panel.Title != "Workloads by health" {
			continue
		}
		total := 0.0
		for _, s := range p.query(t, grafanaExpr(panel.Targets[0].Expr), now) {
			if s.Metric.Get("workload_namespace") == f.ns {
				total += s.F
			}
		}
		if total != 1 {
			t.Errorf("Workloads by health sums to %v, want the workload counted once", total)
		}
	}

	// No alert fires on this healthy installation; each evaluates.
	_, objs := build(t, "monitoring")
	rule := mustFind(t, objs, "PrometheusRule", "embark")
	for _, g := range rule.Object["spec"].(map[string]any)["groups"].([]any) {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			r := r.(map[string]any)
			if got := p.query(t, r["expr"].(string), now); len(got) > 0 {
				t.Errorf("alert %v fires on a healthy installation: %v", r["alert"], got)
			}
		}
	}
	// The absence alert fires when no replica is scraped.
	if got := p.query(t, `absent(embark_build_info)`, now.Add(time.Hour)); len(got) != 1 {
		t.Errorf("EmbarkOnboardingEndpointAbsent does not fire an hour after the last scrape: %v", got)
	}

	rs.stop(t, cancel)
}

// metricValue sums the samples of one metric family scraped from addr.
func metricValue(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, m := range families[name].GetMetric() {
		sum += m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetUntyped().GetValue()
	}
	return sum
}
