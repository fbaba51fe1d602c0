package presence

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/registry"
)

// Values of the health label of embark_registry_workloads.
const (
	healthHealthy   = "healthy"
	healthUnhealthy = "unhealthy"
	// healthUnchecked: the WorkloadGroup has no probe.
	healthUnchecked = "unchecked"
)

// WorkloadNamespaceLabel names the namespace of the workloads a series
// counts. Not "namespace": the Prometheus Operator sets a target label of
// that name (the scraped Pod's namespace) and, without honorLabels,
// renames a metric's own label to exported_namespace.
const WorkloadNamespaceLabel = "workload_namespace"

// HealthMetricsOption configures NewHealthMetrics.
type HealthMetricsOption func(*workloadCollector)

// FleetFromLeader reports embark_registry_workloads only while leading()
// is true (the sweeper leader, lifecycle.Lifecycle.IsLeader): every replica
// reads the same WorkloadEntries, so a fleet count from each would be
// multiplied by the number of replicas in a sum.
func FleetFromLeader(leading func() bool) HealthMetricsOption {
	return func(c *workloadCollector) { c.leading = leading }
}

// HealthMetrics are the health mirror's metrics.
type HealthMetrics struct {
	firstHealthyHist prometheus.Histogram
	writes           *prometheus.CounterVec
}

// NewHealthMetrics registers the health metrics with reg:
//
//   - embark_registry_health_time_to_first_healthy_seconds: from a workload's
//     connection to its first healthy report being stored;
//   - embark_registry_health_writes_total{result}: health reports stored
//     ("stored"), attempts that failed and are retried ("retried"), and
//     reports dropped because the registration is gone or another replica
//     holds the workload ("dropped");
//   - embark_registry_workloads{workload_namespace,group,health}: registered
//     workloads (Embark's WorkloadEntries) by health, healthy, unhealthy (a
//     probe and no passing report; istiod routes no traffic to them) or
//     unchecked (no probe), counted from cache, a reader of WorkloadEntries
//     (normally the informer cache), at each scrape. A nil cache leaves it
//     out. Groups without WorkloadEntries have no series (a deleted group's
//     series ends). With FleetFromLeader only the leader reports it.
func NewHealthMetrics(reg prometheus.Registerer, cache client.Reader, opts ...HealthMetricsOption) (*HealthMetrics, error) {
	m := &HealthMetrics{
		firstHealthyHist: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "embark_registry_health_time_to_first_healthy_seconds",
			Help:    "Time from a workload's sidecar connecting to its first healthy report being stored.",
			Buckets: prometheus.ExponentialBuckets(0.25, 2, 12),
		}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "embark_registry_health_writes_total",
			Help: "Health reports stored, write attempts failed and retried, and reports dropped.",
		}, []string{"result"}),
	}
	cols := []prometheus.Collector{m.firstHealthyHist, m.writes}
	if cache != nil {
		wc := &workloadCollector{cache: cache, desc: prometheus.NewDesc(
			"embark_registry_workloads",
			"Registered workloads (Embark's WorkloadEntries) by health: healthy, unhealthy or unchecked (no probe); reported by the sweeper leader only.",
			[]string{WorkloadNamespaceLabel, "group", "health"}, nil)}
		for _, o := range opts {
			o(wc)
		}
		cols = append(cols, wc)
	}
	for _, col := range cols {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("register health metrics: %w", err)
		}
	}
	for _, r := range []string{"stored", "retried", "dropped"} {
		m.writes.WithLabelValues(r)
	}
	return m, nil
}

func (m *HealthMetrics) stored() {
	if m != nil {
		m.writes.WithLabelValues("stored").Inc()
	}
}

func (m *HealthMetrics) failed() {
	if m != nil {
		m.writes.WithLabelValues("retried").Inc()
	}
}

func (m *HealthMetrics) dropped() {
	if m != nil {
		m.writes.WithLabelValues("dropped").Inc()
	}
}

func (m *HealthMetrics) firstHealthy(d time.Duration) {
	if m != nil {
		m.firstHealthyHist.Observe(d.Seconds())
	}
}

// workloadCollector counts Embark's WorkloadEntries by health at each scrape.
type workloadCollector struct {
	cache   client.Reader
	desc    *prometheus.Desc
	leading func() bool // nil: always report
}

func (c *workloadCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *workloadCollector) Collect(ch chan<- prometheus.Metric) {
	if c.leading != nil && !c.leading() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list := &istionetworkingv1.WorkloadEntryList{}
	if err := c.cache.List(ctx, list); err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, fmt.Errorf("list WorkloadEntries: %w", err))
		return
	}
	type key struct{ ns, group, health string }
	counts := map[key]int{}
	for _, we := range list.Items {
		if _, ok := registry.OwnedBy(we.OwnerReferences, ""); !ok {
			continue
		}
		counts[key{we.Namespace, we.Annotations[registry.AnnotationWorkloadGroup], WorkloadEntryHealth(we)}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), k.ns, k.group, k.health)
	}
}

// WorkloadEntryHealth says how istiod treats a WorkloadEntry: "healthy"
// (Healthy condition True), "unhealthy" (health checks enabled and no True
// condition) or "unchecked" (health checks not enabled).
func WorkloadEntryHealth(we *istionetworkingv1.WorkloadEntry) string {
	cond := registry.IstioCondition(we.Status.Conditions, registry.ConditionHealthy)
	switch {
	case cond != nil && cond.GetStatus() == string(metav1.ConditionTrue):
		return healthHealthy
	case cond != nil || we.Annotations[registry.AnnotationHealthChecksEnabled] == "true":
		return healthUnhealthy
	default:
		return healthUnchecked
	}
}

// ReceivesTraffic reports whether istiod routes to a WorkloadEntry, by
// istiod's rule: when health checks are enabled (annotation
// proxy.istio.io/health-checks-enabled "true") only while its Healthy
// condition is True; otherwise always. Translations that build endpoints
// from WorkloadEntries use the same rule.
func ReceivesTraffic(we *istionetworkingv1.WorkloadEntry) bool {
	if we.Annotations[registry.AnnotationHealthChecksEnabled] != "true" {
		return true
	}
	cond := registry.IstioCondition(we.Status.Conditions, registry.ConditionHealthy)
	return cond != nil && cond.GetStatus() == string(metav1.ConditionTrue)
}
