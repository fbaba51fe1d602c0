package xds

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Reasons (metrics labels) of refused streams found by authorize.
const (
	reasonBadNodeID           = "bad_node_id"
	reasonOtherWorkload       = "other_workload"
	reasonUnknownRegistration = "unknown_registration"
	reasonRegistrationDeleted = "registration_deleted"
	reasonStaleCredential     = "stale_credential"
	reasonNamespaceNotServed  = "namespace_not_served"
	reasonServiceAccount      = "wrong_service_account"
	reasonAddress             = "wrong_address"
	reasonBadMetadata         = "bad_metadata"
	reasonUnavailable         = "unavailable"
	reasonInternal            = "internal"
	reasonNoFirstRequest      = "no_first_request"
)

// Reasons (metrics labels) of streams the server closed.
const (
	closeRegistrationDeleted = "registration_deleted"
	closeCredentialDeleted   = "credential_deleted"
	closeCredentialExpired   = "credential_expired"
	closeNodeSwitched        = "node_switched"
	closeSubscriptionLimit   = "subscription_limit"
)

// refusal is a refused stream's gRPC status and the reason metrics count it
// under.
type refusal struct {
	code   codes.Code
	reason string
	msg    string
}

func (r *refusal) Error() string { return r.msg }

// GRPCStatus makes the refusal the stream's status.
func (r *refusal) GRPCStatus() *status.Status { return status.New(r.code, r.msg) }

func refuse(code codes.Code, reason, format string, args ...any) error {
	return &refusal{code: code, reason: reason, msg: fmt.Sprintf(format, args...)}
}

// Metrics are the xDS server's metrics.
type Metrics struct {
	refused *prometheus.CounterVec
	closed  *prometheus.CounterVec
}

// NewMetrics registers the xDS server's metrics with reg:
// embark_xds_refused_streams_total{code,reason} (streams refused before
// binding to a workload) and
// embark_xds_streams_closed_by_server_total{reason} (bound streams the server
// ended: registration_deleted, credential_deleted, credential_expired).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "embark_xds_refused_streams_total",
			Help: "ADS streams refused before they were bound to a workload, by gRPC code and reason.",
		}, []string{"code", "reason"}),
		closed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "embark_xds_streams_closed_by_server_total",
			Help: "Workload ADS streams the server closed, by reason.",
		}, []string{"reason"}),
	}
	for _, c := range []prometheus.Collector{m.refused, m.closed} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register xDS metrics: %w", err)
		}
	}
	return m, nil
}

// refusedStream counts err (a refusal or another status error) and returns it.
func (m *Metrics) refusedStream(err error) error {
	if m == nil || err == nil {
		return err
	}
	reason := reasonInternal
	var r *refusal
	if errors.As(err, &r) {
		reason = r.reason
	}
	m.refused.WithLabelValues(status.Code(err).String(), reason).Inc()
	return err
}

func (m *Metrics) closedByServer(reason string) {
	if m == nil {
		return
	}
	m.closed.WithLabelValues(reason).Inc()
}
