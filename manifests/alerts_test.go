package manifests

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/rules"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
)

// alertRules reads monitoring/prometheusrule.yaml (through kustomize, as
// it is deployed) into Prometheus' own alerting rules: its `for:`, labels
// and annotations included.
func alertRules(t *testing.T) []*rules.AlertingRule {
	t.Helper()
	_, objs := build(t, "monitoring")
	rule := mustFind(t, objs, "PrometheusRule", "embark")
	var out []*rules.AlertingRule
	for _, g := range rule.Object["spec"].(map[string]any)["groups"].([]any) {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			r := r.(map[string]any)
			name, _ := r["alert"].(string)
			expr, err := parser.NewParser(parser.Options{}).ParseExpr(r["expr"].(string))
			if err != nil {
				t.Fatalf("alert %s: %v", name, err)
			}
			hold, err := model.ParseDuration(fmt.Sprint(r["for"]))
			if err != nil {
				t.Fatalf("alert %s: for: %v", name, err)
			}
			out = append(out, rules.NewAlertingRule(name, expr, time.Duration(hold), 0,
				labels.FromMap(stringMap(r["labels"])), labels.FromMap(stringMap(r["annotations"])),
				labels.EmptyLabels(), "", true, nil))
		}
	}
	if len(out) == 0 {
		t.Fatal("no alerting rules")
	}
	return out
}

func stringMap(v any) map[string]string {
	out := map[string]string{}
	m, _ := v.(map[string]any)
	for k, v := range m {
		out[k] = fmt.Sprint(v)
	}
	return out
}

// fault turns one replica's real scrape into what it exposes k scrapes
// (30s each) into a failure: it changes fams (a copy of the real scrape)
// and returns false if the replica is not scraped at all.
type fault func(t *testing.T, k int, tg scrapeTarget, fams families) (scraped bool)

// The alert timeline: 10 minutes healthy, then 40 minutes of the failure
// (the longest rate window, 15m, plus the longest for:, 15m, fit), one
// scrape of each replica and one rule evaluation every 30s.
const (
	scrapeInterval = 30 * time.Second
	healthySteps   = 20
	faultSteps     = 80
)

// run scrapes the replicas' real metrics (fetched once, held in scraped),
// changed by f from the fault's start, into a fresh TSDB and evaluates
// every alerting rule after each scrape with Prometheus' rule engine. It
// returns, per alert, when it first went pending and when it first fired
// (zero if never), and the labels it fired with.
func runAlertTimeline(t *testing.T, ctx context.Context, rs *replicas, scraped map[string]families, f fault) (pending, firing map[string]time.Time, firedLabels map[string]labels.Labels, faultStart time.Time) {
	t.Helper()
	p := newPromDB(t)
	query := rules.EngineQueryFunc(p.engine, p.db)
	rls := alertRules(t)
	pending, firing, firedLabels = map[string]time.Time{}, map[string]time.Time{}, map[string]labels.Labels{}
	start := time.Now().Add(-(healthySteps + faultSteps) * scrapeInterval).Truncate(time.Second)
	faultStart = start.Add(healthySteps * scrapeInterval)
	for i := 0; i < healthySteps+faultSteps; i++ {
		now := start.Add(time.Duration(i) * scrapeInterval)
		app := p.db.Appender(ctx)
		for _, tg := range rs.targets {
			fams := families{}
			for name, mf := range scraped[tg.pod] {
				fams[name] = proto.Clone(mf).(*dto.MetricFamily)
			}
			if i >= healthySteps && f != nil && !f(t, i-healthySteps, tg, fams) {
				continue
			}
			appendFamilies(t, app, fams, targetLabels(t, tg), now)
		}
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
		for _, r := range rls {
			if _, err := r.Eval(ctx, 0, now, query, nil, 0); err != nil {
				t.Fatalf("evaluate %s: %v", r.Name(), err)
			}
			for _, a := range r.ActiveAlerts() {
				if _, ok := pending[r.Name()]; !ok {
					pending[r.Name()] = now
				}
				if a.State == rules.StateFiring {
					if _, ok := firing[r.Name()]; !ok {
						firing[r.Name()] = now
						firedLabels[r.Name()] = a.Labels
					}
				}
			}
		}
	}
	return pending, firing, firedLabels, faultStart
}

// series returns the sample of family name with exactly the label values
// lv in fams, adding it if the scrape had none. Its label names must be
// the family's (as the real replica or, for a family nothing has touched
// yet, the real constructors export them), so a fault cannot invent a
// label the endpoint does not have; a new histogram sample gets the
// family's real buckets, empty.
func series(t *testing.T, fams families, name string, lv map[string]string) *dto.Metric {
	t.Helper()
	mf, ok := fams[name]
	fresh := !ok // mf.Metric[0] is the template's sample, removed on return
	if !ok {
		tmpl, ok := templates(t)[name]
		if !ok {
			t.Fatalf("Embark exports no metric %s", name)
		}
		mf = proto.Clone(tmpl).(*dto.MetricFamily)
		fams[name] = mf
		mf.Metric = mf.Metric[:1]
		mf.Metric[0].Label = nil // names set below from the template
		defer func() { mf.Metric = mf.Metric[1:] }()
		for _, l := range tmpl.GetMetric()[0].GetLabel() {
			mf.Metric[0].Label = append(mf.Metric[0].Label, &dto.LabelPair{Name: proto.String(l.GetName())})
		}
	}
	var names []string
	for _, l := range mf.GetMetric()[0].GetLabel() {
		names = append(names, l.GetName())
	}
	var asked []string
	for k := range lv {
		asked = append(asked, k)
	}
	slices.Sort(names)
	slices.Sort(asked)
	if !slices.Equal(names, asked) {
		t.Fatalf("%s has labels %v; the fault sets %v", name, names, asked)
	}
next:
	for i, m := range mf.GetMetric() {
		if fresh && i == 0 {
			continue
		}
		for _, l := range m.GetLabel() {
			if l.GetValue() != lv[l.GetName()] {
				continue next
			}
		}
		if len(m.GetLabel()) == len(lv) {
			return m
		}
	}
	m := proto.Clone(mf.GetMetric()[0]).(*dto.Metric)
	for _, l := range m.GetLabel() {
		l.Value = proto.String(lv[l.GetName()])
	}
	switch {
	case m.Counter != nil:
		m.Counter.Value = proto.Float64(0)
	case m.Gauge != nil:
		m.Gauge.Value = proto.Float64(0)
	case m.Histogram != nil:
		m.Histogram.SampleCount, m.Histogram.SampleSum = proto.Uint64(0), proto.Float64(0)
		for _, b := range m.Histogram.Bucket {
			b.CumulativeCount = proto.Uint64(0)
		}
	}
	mf.Metric = append(mf.Metric, m)
	return m
}

var templateFamilies families

// templates are the families the real constructors export (each vector
// with one child): the label names and buckets of metrics a healthy
// replica has not exported yet.
func templates(t *testing.T) families {
	t.Helper()
	if templateFamilies == nil {
		mfs, err := gathered(t).Gather()
		if err != nil {
			t.Fatal(err)
		}
		templateFamilies = families{}
		for _, mf := range mfs {
			templateFamilies[mf.GetName()] = mf
		}
	}
	return templateFamilies
}

// addCounter adds n to a counter sample.
func addCounter(t *testing.T, fams families, name string, lv map[string]string, n float64) {
	t.Helper()
	m := series(t, fams, name, lv)
	if m.Counter == nil {
		t.Fatalf("%s is not a counter", name)
	}
	m.Counter.Value = proto.Float64(m.Counter.GetValue() + n)
}

// setGauge sets a gauge sample.
func setGauge(t *testing.T, fams families, name string, lv map[string]string, v float64) {
	t.Helper()
	m := series(t, fams, name, lv)
	if m.Gauge == nil {
		t.Fatalf("%s is not a gauge", name)
	}
	m.Gauge.Value = proto.Float64(v)
}

// observe adds n observations of v to a histogram sample, in the
// family's real buckets.
func observe(t *testing.T, fams families, name string, lv map[string]string, v float64, n uint64) {
	t.Helper()
	m := series(t, fams, name, lv)
	h := m.Histogram
	if h == nil {
		t.Fatalf("%s is not a histogram", name)
	}
	for _, b := range h.Bucket {
		if v <= b.GetUpperBound() {
			b.CumulativeCount = proto.Uint64(b.GetCumulativeCount() + n)
		}
	}
	h.SampleCount = proto.Uint64(h.GetSampleCount() + n)
	h.SampleSum = proto.Float64(h.GetSampleSum() + v*float64(n))
}

// firstLabels returns the label values of the first sample of a family
// the real replica exported.
func firstLabels(t *testing.T, fams families, name string) map[string]string {
	t.Helper()
	mf, ok := fams[name]
	if !ok || len(mf.GetMetric()) == 0 {
		t.Fatalf("the replica exported no %s", name)
	}
	lv := map[string]string{}
	for _, l := range mf.GetMetric()[0].GetLabel() {
		lv[l.GetName()] = l.GetValue()
	}
	return lv
}

// labelsWhere returns the label values of the first sample of a family
// the real replica exported whose label key is value.
func labelsWhere(t *testing.T, fams families, name, key, value string) map[string]string {
	t.Helper()
	for _, m := range fams[name].GetMetric() {
		lv := map[string]string{}
		for _, l := range m.GetLabel() {
			lv[l.GetName()] = l.GetValue()
		}
		if lv[key] == value {
			return lv
		}
	}
	t.Fatalf("the replica exported no %s with %s=%q", name, key, value)
	return nil
}

// Every alert of monitoring/prometheusrule.yaml fires, through Prometheus'
// own rule engine (its `for:` included) over a real TSDB, on the series two
// real endpoint replicas expose, scraped through the Prometheus Operator's
// relabelling; and none fires on the healthy installation.
//
// What is real: the metric names, types, label names and label values
// (an onboarded workload, a refused Authorize) and the histograms'
// buckets come from the replicas' /metrics; the relabelling is the
// operator's; evaluation is Prometheus'. What is made up: the failure
// itself. Each case changes the scraped samples the way the failure
// would (counters grow, histograms get slow observations in the real
// buckets, a gauge changes, a replica stops being scraped) instead of
// making the endpoint fail for 25 minutes; a fault may only use label
// names the endpoint exports (series refuses others). The tests of each
// package prove the endpoint counts those failures.
func TestEveryAlertFires(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	rs := startReplicas(t, ctx)
	onboard(t, ctx, rs.addrs[0].onboarding, rs.host, rs.fixture, "172.31.5.254")
	rs.waitWorkload(t, ctx)
	// A refused Authorize (a namespace the endpoint does not serve): the
	// replica exports a real denial series, with the stage and reason it
	// counts.
	conn, err := grpc.NewClient(rs.addrs[1].onboarding, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := authorize(t, ctx, onboardingv1alpha1.NewOnboardingServiceClient(conn), rs.host, rs.fixture, "kube-system"); err == nil {
		t.Fatal("Authorize for a namespace the endpoint does not serve succeeded")
	}

	leader, other := rs.leader(t)
	scraped := map[string]families{}
	for _, tg := range rs.targets {
		scraped[tg.pod] = fetch(t, tg)
	}
	denial := firstLabels(t, scraped[other.pod], "embark_onboarding_denials_total")
	// The fixture's workload: the API server may hold other tests'
	// registrations, which the leader counts too.
	workload := labelsWhere(t, scraped[leader.pod], "embark_registry_workloads", "workload_namespace", rs.fixture.ns)
	unhealthy := map[string]string{}
	for k, v := range workload {
		unhealthy[k] = v
	}
	unhealthy["health"] = "unhealthy"

	on := func(pod string, f func(t *testing.T, k int, fams families)) fault {
		return func(t *testing.T, k int, tg scrapeTarget, fams families) bool {
			if tg.pod == pod {
				f(t, k, fams)
			}
			return true
		}
	}
	cases := []struct {
		alert string
		fault fault
		// labels the firing alert must carry (besides alertname and severity)
		want map[string]string
	}{
		{alert: "EmbarkOnboardingEndpointAbsent", fault: func(*testing.T, int, scrapeTarget, families) bool { return false }},
		{alert: "EmbarkNoSweeperLeader", fault: func(_ *testing.T, _ int, tg scrapeTarget, _ families) bool {
			return tg.pod != leader.pod // the leader is gone; the other replica never took over
		}},
		{alert: "EmbarkSeveralSweeperLeaders", fault: on(other.pod, func(t *testing.T, _ int, fams families) {
			setGauge(t, fams, "embark_registry_sweeper_leader", map[string]string{}, 1)
		})},
		{alert: "EmbarkOnboardingErrors", fault: on(other.pod, func(t *testing.T, k int, fams families) {
			addCounter(t, fams, "embark_onboarding_requests_total", map[string]string{"method": "Register", "code": "Unavailable"}, float64(3*k)) // 0.1/s
		})},
		{alert: "EmbarkOnboardingDenials", fault: on(other.pod, func(t *testing.T, k int, fams families) {
			addCounter(t, fams, "embark_onboarding_denials_total", denial, float64(6*k)) // 0.2/s
		}), want: denial},
		{alert: "EmbarkOnboardingSlow", fault: on(other.pod, func(t *testing.T, k int, fams families) {
			observe(t, fams, "embark_onboarding_request_duration_seconds", map[string]string{"method": "Register"}, 4.5, uint64(10*k))
		})},
		{alert: "EmbarkGracePeriodRemovalsSpike", fault: on(leader.pod, func(t *testing.T, k int, fams families) {
			addCounter(t, fams, "embark_registry_grace_period_removals_total", map[string]string{"cause": "disconnected"}, float64(k))
		})},
		{alert: "EmbarkReplicaGone", fault: on(leader.pod, func(t *testing.T, k int, fams families) {
			if k >= 1 {
				addCounter(t, fams, "embark_registry_replica_gone_disconnects_total", map[string]string{}, 3)
			}
		})},
		{alert: "EmbarkDisconnectWritesSlow", fault: on(leader.pod, func(t *testing.T, k int, fams families) {
			observe(t, fams, "embark_registry_disconnect_status_write_seconds", map[string]string{}, 45, uint64(2*k))
		})},
		{alert: "EmbarkSidecarsRejectConfiguration", fault: on(other.pod, func(t *testing.T, k int, fams families) {
			addCounter(t, fams, "embark_xds_nacks_total", map[string]string{"type": "envoy.config.cluster.v3.Cluster"}, float64(k))
		}), want: map[string]string{"type": "envoy.config.cluster.v3.Cluster"}},
		{alert: "EmbarkUnhealthyWorkloads", fault: on(leader.pod, func(t *testing.T, _ int, fams families) {
			setGauge(t, fams, "embark_registry_workloads", unhealthy, 1)
		}), want: map[string]string{"workload_namespace": rs.fixture.ns, "group": workload["group"]}},
		// istiod mode. These replicas run standalone, so the relays' series
		// are added with the real constructors' names and labels; the values
		// are those test/istiod's TestIstiodModeMetrics sees a real relay
		// report against a real istiod that is stopped or refuses.
		{alert: "EmbarkIstiodUnreachable", fault: on(other.pod, func(t *testing.T, k int, fams families) {
			// A failing gRPC connection alternates between the two states.
			failing := map[bool]string{true: "connecting", false: "transient_failure"}[k%2 == 0]
			for _, s := range []string{"idle", "connecting", "ready", "transient_failure", "shutdown"} {
				v := 0.0
				if s == failing {
					v = 1
				}
				setGauge(t, fams, "embark_istiod_connection_state", map[string]string{"state": s}, v)
			}
		}), want: map[string]string{"pod": other.pod}},
		{alert: "EmbarkRelayErrors", fault: on(other.pod, func(t *testing.T, k int, fams families) {
			rev := map[string]string{"istiod_revision": "default"}
			setGauge(t, fams, "embark_xds_relay_streams", rev, 20)
			// each of the 20 streams fails every 20s: 1/s
			addCounter(t, fams, "embark_xds_relay_upstream_errors_total", map[string]string{"istiod_revision": "default", "code": "Unavailable"}, float64(30*k))
		}), want: map[string]string{"pod": other.pod, "istiod_revision": "default"}},
		{alert: "EmbarkCertificateRequestsFailing", fault: on(other.pod, func(t *testing.T, k int, fams families) {
			addCounter(t, fams, "embark_ca_requests_total", map[string]string{"code": "OK"}, float64(6*k))
			addCounter(t, fams, "embark_ca_requests_total", map[string]string{"code": "Unavailable"}, float64(6*k)) // half fail
		}), want: map[string]string{"pod": other.pod}},
		{alert: "EmbarkCertificateExpiresSoon", fault: on(other.pod, func(t *testing.T, _ int, fams families) {
			setGauge(t, fams, "embark_istiod_root_expiry_timestamp_seconds", map[string]string{}, float64(time.Now().Add(10*24*time.Hour).Unix()))
		}), want: map[string]string{"pod": other.pod, "expiring": "istiod-root"}},
		{alert: "EmbarkCertificateExpiryCritical", fault: on(leader.pod, func(t *testing.T, _ int, fams families) {
			setGauge(t, fams, "embark_serving_certificate_expiry_timestamp_seconds", map[string]string{}, float64(time.Now().Add(2*24*time.Hour).Unix()))
		}), want: map[string]string{"pod": leader.pod, "expiring": "serving-certificate"}},
	}

	rls := alertRules(t)
	holds := map[string]time.Duration{}
	for _, r := range rls {
		holds[r.Name()] = r.HoldDuration()
	}
	covered := map[string]bool{}
	for _, tc := range cases {
		covered[tc.alert] = true
		t.Run(tc.alert, func(t *testing.T) {
			if _, ok := holds[tc.alert]; !ok {
				t.Fatalf("monitoring/prometheusrule.yaml has no alert %s", tc.alert)
			}
			pending, firing, fired, faultStart := runAlertTimeline(t, ctx, rs, scraped, tc.fault)
			if at, ok := pending[tc.alert]; ok && at.Before(faultStart) {
				t.Errorf("%s was active at %s, before the failure began at %s", tc.alert, at, faultStart)
			}
			at, ok := firing[tc.alert]
			if !ok {
				t.Fatalf("%s did not fire in %s of the failure (active since %v)", tc.alert, faultSteps*scrapeInterval, pending[tc.alert])
			}
			if d := at.Sub(pending[tc.alert]); d < holds[tc.alert] {
				t.Errorf("%s fired %s after it went pending, before its for: %s", tc.alert, d, holds[tc.alert])
			}
			for k, v := range tc.want {
				if got := fired[tc.alert].Get(k); got != v {
					t.Errorf("%s fired with %s=%q, want %q (labels %s)", tc.alert, k, got, v, fired[tc.alert])
				}
			}
			t.Logf("%s: failure at %s, pending after %s, firing after %s", tc.alert, faultStart.Format(time.TimeOnly),
				pending[tc.alert].Sub(faultStart), at.Sub(faultStart))
		})
	}
	for _, r := range rls {
		if !covered[r.Name()] {
			t.Errorf("alert %s has no case here: make it fire", r.Name())
		}
	}

	t.Run("healthy installation: no alert", func(t *testing.T) {
		pending, _, _, _ := runAlertTimeline(t, ctx, rs, scraped, nil)
		for name, at := range pending {
			t.Errorf("%s active at %s on the healthy installation", name, at)
		}
	})
	// A healthy replica in istiod mode: the connection ready, streams
	// relayed, istiod ending each at its maximum connection age (code OK)
	// and a rare failure, certificates issued with a few refusals, and
	// certificates and keys valid for months.
	t.Run("healthy istiod mode: no alert", func(t *testing.T) {
		healthy := func(t *testing.T, k int, _ scrapeTarget, fams families) bool {
			for _, s := range []string{"idle", "connecting", "ready", "transient_failure", "shutdown"} {
				setGauge(t, fams, "embark_istiod_connection_state", map[string]string{"state": s}, map[bool]float64{true: 1}[s == "ready"])
			}
			rev := map[string]string{"istiod_revision": "default"}
			setGauge(t, fams, "embark_xds_relay_streams", rev, 100)
			addCounter(t, fams, "embark_xds_relay_upstream_errors_total", map[string]string{"istiod_revision": "default", "code": "OK"}, float64(2*k))
			addCounter(t, fams, "embark_xds_relay_upstream_errors_total", map[string]string{"istiod_revision": "default", "code": "Unavailable"}, float64(k/10))
			addCounter(t, fams, "embark_ca_requests_total", map[string]string{"code": "OK"}, float64(10*k))
			addCounter(t, fams, "embark_ca_requests_total", map[string]string{"code": "PermissionDenied"}, float64(k))
			year := float64(time.Now().Add(365 * 24 * time.Hour).Unix())
			setGauge(t, fams, "embark_istiod_root_expiry_timestamp_seconds", map[string]string{}, year)
			setGauge(t, fams, "embark_serving_certificate_expiry_timestamp_seconds", map[string]string{}, year)
			return true
		}
		pending, _, _, _ := runAlertTimeline(t, ctx, rs, scraped, healthy)
		for name, at := range pending {
			t.Errorf("%s active at %s on a healthy replica in istiod mode", name, at)
		}
	})
	rs.stop(t, cancel)
}

// Every alert waits (`for:`) before it fires, and its runbook_url names an
// entry of docs/troubleshooting.md (a heading whose GitHub anchor is the
// URL's fragment).
func TestEveryAlertHasForAndRunbook(t *testing.T) {
	doc, err := os.ReadFile("../docs/troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if title, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") {
			anchors[githubAnchor(title)] = true
		}
	}
	const prefix = "https://github.com/embark-mesh/embark/blob/main/docs/troubleshooting.md#"
	for _, r := range alertRules(t) {
		if r.HoldDuration() <= 0 {
			t.Errorf("%s has no for:", r.Name())
		}
		url := r.Annotations().Get("runbook_url")
		anchor, ok := strings.CutPrefix(url, prefix)
		if !ok {
			t.Errorf("%s runbook_url %q is not into docs/troubleshooting.md (%s...)", r.Name(), url, prefix)
			continue
		}
		if !anchors[anchor] {
			t.Errorf("%s runbook_url #%s: docs/troubleshooting.md has no such heading", r.Name(), anchor)
		}
	}
}

// githubAnchor is the fragment GitHub gives a Markdown heading: lower
// case, spaces to hyphens, punctuation other than - and _ dropped.
func githubAnchor(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(title)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
