package lifecycle

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Metrics are the lifecycle's Prometheus metrics. A nil
// *Metrics records nothing.
type Metrics struct {
	removals    *prometheus.CounterVec
	replicaLost prometheus.Counter
	leader      prometheus.Gauge
	drift       *prometheus.CounterVec
	recreations prometheus.Counter
	orphans     *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		removals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "embark", Subsystem: "registry", Name: "grace_period_removals_total",
			Help: "Registrations removed (with their WorkloadEntry) after their workload had no ADS stream for the grace period, by cause: disconnected, never_connected, replica_gone.",
		}, []string{"cause"}),
		replicaLost: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "embark", Subsystem: "registry", Name: "replica_gone_disconnects_total",
			Help: "Registrations marked disconnected because the endpoint replica holding their stream was gone.",
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "embark", Subsystem: "registry", Name: "sweeper_leader",
			Help: "1 while this replica is the elected sweeper, else 0.",
		}),
		drift: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "embark", Subsystem: "registry", Name: "workloadgroup_out_of_date_writes_total",
			Help: "Writes of the WorkloadGroupOutOfDate condition, by the status written.",
		}, []string{"status"}),
		recreations: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "embark", Subsystem: "registry", Name: "workloadentry_recreations_total",
			Help: "WorkloadEntries created again after someone else deleted them while their registration lived.",
		}),
		orphans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "embark", Subsystem: "registry", Name: "orphans_removed_total",
			Help: "Objects Embark wrote for a registration removed after the registration was gone without them (deleted with orphan propagation), by kind: secret (the sidecar credential), workloadentry.",
		}, []string{"kind"}),
	}
	for _, c := range []prometheus.Collector{m.removals, m.replicaLost, m.leader, m.drift, m.recreations, m.orphans} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register lifecycle metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) removed(cause string) {
	if m != nil {
		m.removals.WithLabelValues(cause).Inc()
	}
}

func (m *Metrics) replicaGone() {
	if m != nil {
		m.replicaLost.Inc()
	}
}

func (m *Metrics) setLeader(leading bool) {
	if m == nil {
		return
	}
	if leading {
		m.leader.Set(1)
	} else {
		m.leader.Set(0)
	}
}

func (m *Metrics) recreated() {
	if m != nil {
		m.recreations.Inc()
	}
}

func (m *Metrics) driftWritten(status metav1.ConditionStatus) {
	if m != nil {
		m.drift.WithLabelValues(string(status)).Inc()
	}
}

func (m *Metrics) orphanRemoved(kind string) {
	if m != nil {
		m.orphans.WithLabelValues(kind).Inc()
	}
}
