package relay

import (
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// Metrics of the relay; a nil *Metrics records nothing. Every series
// carries istiod_revision: the revision of the istiod the relay reaches
// (Options.Revision; "default" for none), so that the streams relayed to
// each revision of a canary upgrade show apart.
type Metrics struct {
	streams   *prometheus.GaugeVec
	upstreams *prometheus.GaugeVec
	connects  *prometheus.CounterVec
	failures  *prometheus.CounterVec
	errors    *prometheus.CounterVec
	resyncs   *prometheus.CounterVec
	pushes    *prometheus.CounterVec
	added     *prometheus.HistogramVec
}

// NewMetrics registers with reg:
// embark_xds_relay_streams (sidecar streams relayed to istiod),
// embark_xds_relay_upstream_streams (of those, with an open istiod stream),
// embark_xds_relay_upstream_connects_total (istiod streams opened),
// embark_xds_relay_upstream_failures_total (istiod streams that failed or
// could not be opened; each is retried with backoff),
// embark_xds_relay_upstream_errors_total{code} (the same failures by gRPC
// code), embark_xds_relay_resyncs_total (subscriptions restored on a new
// istiod stream after one failed), embark_xds_relay_pushes_total{type}
// (istiod responses relayed to sidecars) and
// embark_xds_relay_push_added_seconds (from a response read from istiod to
// its send to the sidecar returning: what the relay adds to a push).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	rev := []string{"istiod_revision"}
	m := &Metrics{
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "embark_xds_relay_streams",
			Help: "Sidecar ADS streams relayed to istiod, by istiod revision.",
		}, rev),
		upstreams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "embark_xds_relay_upstream_streams",
			Help: "Relayed sidecar streams whose istiod stream is open.",
		}, rev),
		connects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "embark_xds_relay_upstream_connects_total",
			Help: "istiod ADS streams opened for relayed sidecar streams.",
		}, rev),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "embark_xds_relay_upstream_failures_total",
			Help: "istiod ADS streams that failed or could not be opened; each is retried with backoff while its sidecar stays connected.",
		}, rev),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "embark_xds_relay_upstream_errors_total",
			Help: "istiod ADS streams that failed or could not be opened, by gRPC status code (OK: istiod ended the stream without an error).",
		}, []string{"istiod_revision", "code"}),
		resyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "embark_xds_relay_resyncs_total",
			Help: "Relayed streams whose subscriptions were restored on a new istiod stream after the previous one failed.",
		}, rev),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "embark_xds_relay_pushes_total",
			Help: "istiod discovery responses relayed to sidecars, by resource type.",
		}, []string{"istiod_revision", "type"}),
		added: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "embark_xds_relay_push_added_seconds",
			Help:    "Latency the relay adds to a push: from the response read from istiod to its send to the sidecar returning.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, rev),
	}
	for _, c := range []prometheus.Collector{m.streams, m.upstreams, m.connects, m.failures, m.errors, m.resyncs, m.pushes, m.added} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register xDS relay metrics: %w", err)
		}
	}
	return m, nil
}

// pushTypes are the resource types istiod pushes to a sidecar, by the type
// label they are counted under; any other type is counted as "other", so
// that what a sidecar subscribes to cannot add series.
var pushTypes = map[string]bool{
	"envoy.config.cluster.v3.Cluster": true, "envoy.config.listener.v3.Listener": true,
	"envoy.config.route.v3.RouteConfiguration": true, "envoy.config.endpoint.v3.ClusterLoadAssignment": true,
	"envoy.extensions.transport_sockets.tls.v3.Secret": true, "envoy.config.route.v3.VirtualHost": true,
	"envoy.config.core.v3.TypedExtensionConfig": true, "istio.networking.nds.v1.NameTable": true,
	"istio.mesh.v1alpha1.ProxyConfig": true, "istio.workload.Address": true, "istio.security.Authorization": true,
}

// typeLabel is the type label of a pushed typeURL: its message name for
// the types istiod pushes, "other" for any other.
func typeLabel(typeURL string) string {
	if t := strings.TrimPrefix(typeURL, "type.googleapis.com/"); pushTypes[t] {
		return t
	}
	return "other"
}

// revisionLabel is the istiod_revision value of revision.
func revisionLabel(revision string) string {
	if revision == "" {
		return "default"
	}
	return revision
}

// relayMetrics are a Relay's children of Metrics, for its istiod revision.
type relayMetrics struct {
	m         *Metrics
	rev       string
	streams   prometheus.Gauge
	upstreams prometheus.Gauge
	connects  prometheus.Counter
	failures  prometheus.Counter
	resyncs   prometheus.Counter
	added     prometheus.Observer
}

// forRevision returns the children of revision, created at once so that a
// relay that has relayed nothing yet exports zeros; nil for nil m.
func (m *Metrics) forRevision(revision string) *relayMetrics {
	if m == nil {
		return nil
	}
	rev := revisionLabel(revision)
	return &relayMetrics{
		m: m, rev: rev,
		streams:   m.streams.WithLabelValues(rev),
		upstreams: m.upstreams.WithLabelValues(rev),
		connects:  m.connects.WithLabelValues(rev),
		failures:  m.failures.WithLabelValues(rev),
		resyncs:   m.resyncs.WithLabelValues(rev),
		added:     m.added.WithLabelValues(rev),
	}
}

func (m *relayMetrics) streamOpened() {
	if m != nil {
		m.streams.Inc()
	}
}

func (m *relayMetrics) streamClosed() {
	if m != nil {
		m.streams.Dec()
	}
}

// upstreamConnected counts an istiod stream opened; resync tells whether
// it restores the subscriptions of a stream that failed.
func (m *relayMetrics) upstreamConnected(resync bool) {
	if m != nil {
		m.connects.Inc()
		m.upstreams.Inc()
		if resync {
			m.resyncs.Inc()
		}
	}
}

// upstreamFailed counts a failure with its gRPC code; connected tells
// whether the stream was open (counted in upstreams).
func (m *relayMetrics) upstreamFailed(connected bool, code codes.Code) {
	if m != nil {
		m.failures.Inc()
		m.m.errors.WithLabelValues(m.rev, code.String()).Inc()
		if connected {
			m.upstreams.Dec()
		}
	}
}

func (m *relayMetrics) upstreamClosed(connected bool) {
	if m != nil && connected {
		m.upstreams.Dec()
	}
}

// pushed counts a response of typeURL relayed to the sidecar, read from
// istiod at received.
func (m *relayMetrics) pushed(typeURL string, received time.Time) {
	if m != nil {
		m.m.pushes.WithLabelValues(m.rev, typeLabel(typeURL)).Inc()
		m.added.Observe(time.Since(received).Seconds())
	}
}
