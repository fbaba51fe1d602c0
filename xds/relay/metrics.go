package relay

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics of the relay; a nil *Metrics records nothing.
type Metrics struct {
	streams   prometheus.Gauge
	upstreams prometheus.Gauge
	connects  prometheus.Counter
	failures  prometheus.Counter
}

// NewMetrics registers with reg:
// embark_xds_relay_streams (sidecar streams relayed to istiod),
// embark_xds_relay_upstream_streams (of those, with an open istiod stream),
// embark_xds_relay_upstream_connects_total (istiod streams opened) and
// embark_xds_relay_upstream_failures_total (istiod streams that failed or
// could not be opened; each is retried with backoff).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "embark_xds_relay_streams",
			Help: "Sidecar ADS streams relayed to istiod.",
		}),
		upstreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "embark_xds_relay_upstream_streams",
			Help: "Relayed sidecar streams whose istiod stream is open.",
		}),
		connects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "embark_xds_relay_upstream_connects_total",
			Help: "istiod ADS streams opened for relayed sidecar streams.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "embark_xds_relay_upstream_failures_total",
			Help: "istiod ADS streams that failed or could not be opened; each is retried with backoff while its sidecar stays connected.",
		}),
	}
	for _, c := range []prometheus.Collector{m.streams, m.upstreams, m.connects, m.failures} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register xDS relay metrics: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) streamOpened() {
	if m != nil {
		m.streams.Inc()
	}
}

func (m *Metrics) streamClosed() {
	if m != nil {
		m.streams.Dec()
	}
}

func (m *Metrics) upstreamConnected() {
	if m != nil {
		m.connects.Inc()
		m.upstreams.Inc()
	}
}

// upstreamFailed counts a failure; connected tells whether the stream was
// open (counted in upstreams).
func (m *Metrics) upstreamFailed(connected bool) {
	if m != nil {
		m.failures.Inc()
		if connected {
			m.upstreams.Dec()
		}
	}
}

func (m *Metrics) upstreamClosed(connected bool) {
	if m != nil && connected {
		m.upstreams.Dec()
	}
}
