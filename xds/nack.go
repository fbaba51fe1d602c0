package xds

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
)

// NACKMetrics counts the configurations proxies rejected.
type NACKMetrics struct {
	nacks *prometheus.CounterVec
}

// NewNACKMetrics registers embark_xds_nacks_total{type} with reg.
func NewNACKMetrics(reg prometheus.Registerer) (*NACKMetrics, error) {
	m := &NACKMetrics{nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "embark_xds_nacks_total",
		Help: "Responses a proxy rejected (NACKed), by resource type.",
	}, []string{"type"})}
	if err := reg.Register(m.nacks); err != nil {
		return nil, fmt.Errorf("register xDS NACK metrics: %w", err)
	}
	return m, nil
}

// typeLabel shortens a type URL to its message name.
func typeLabel(typeURL string) string {
	return strings.TrimPrefix(typeURL, "type.googleapis.com/")
}

// nacked records a NACK of version of typeURL by st's proxy.
func (s *Server) nacked(st *stream, typeURL, version string, detail *rpcstatus.Status) {
	if m := s.opts.NACKMetrics; m != nil {
		m.nacks.WithLabelValues(typeLabel(typeURL)).Inc()
	}
	s.log.Warn("proxy rejected its configuration (NACK); holding it until the configuration changes",
		"node", st.proxy.NodeID, "type", typeURL, "version", version, "error", detail.GetMessage())
}
