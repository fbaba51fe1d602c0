package upstream

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// states are the connectivity states embark_istiod_connection_state
// reports, each a series of its own.
var states = []connectivity.State{connectivity.Idle, connectivity.Connecting, connectivity.Ready, connectivity.TransientFailure, connectivity.Shutdown}

// Metrics of the connection to istiod; a nil *Metrics records nothing.
type Metrics struct {
	state       *prometheus.GaugeVec
	rootsExpiry prometheus.Gauge
}

// NewMetrics registers with reg embark_istiod_connection_state{state} (1
// for the state the connection to istiod is in, 0 for the others: idle,
// connecting, ready, transient_failure, shutdown) and
// embark_istiod_root_expiry_timestamp_seconds (when the first of the istiod
// roots Embark trusts expires, Unix seconds; updated when RootCertFile is
// read again).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "embark_istiod_connection_state",
			Help: "1 for the gRPC connectivity state of the connection to istiod, 0 for the others.",
		}, []string{"state"}),
		rootsExpiry: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "embark_istiod_root_expiry_timestamp_seconds",
			Help: "When the first of the istiod root certificates Embark verifies istiod with expires, in Unix seconds.",
		}),
	}
	for _, c := range []prometheus.Collector{m.state, m.rootsExpiry} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register istiod connection metrics: %w", err)
		}
	}
	return m, nil
}

// stateLabel is the state label of s: gRPC's name in lower case.
func stateLabel(s connectivity.State) string {
	return strings.ToLower(s.String())
}

// setState reports s as the connection's state.
func (m *Metrics) setState(s connectivity.State) {
	if m == nil {
		return
	}
	for _, o := range states {
		v := 0.0
		if o == s {
			v = 1
		}
		m.state.WithLabelValues(stateLabel(o)).Set(v)
	}
}

// keepConnected keeps conn connected to istiod and reports its state (m
// may be nil) until conn is closed: gRPC leaves a connection idle after it
// breaks until a call needs it, and connects lazily at first; connecting
// whenever it is idle makes a replica reach istiod as soon as it starts
// and keep retrying (with gRPC's backoff) while istiod is down, so the
// state says whether istiod is reachable, not whether a call happened to
// be waiting (an idle state between retries would reset
// EmbarkIstiodUnreachable's for:).
func keepConnected(ctx context.Context, conn *grpc.ClientConn, m *Metrics) {
	for {
		s := conn.GetState()
		m.setState(s)
		if s == connectivity.Idle {
			conn.Connect()
		}
		if s == connectivity.Shutdown || !conn.WaitForStateChange(ctx, s) {
			return
		}
	}
}

// rootsLoaded reports the expiry of the roots in use.
func (m *Metrics) rootsLoaded(expiry time.Time) {
	if m != nil {
		m.rootsExpiry.Set(float64(expiry.Unix()))
	}
}
