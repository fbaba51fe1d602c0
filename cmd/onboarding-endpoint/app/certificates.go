package app

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/xds"
	"github.com/embark-mesh/embark/xds/ca"
	"github.com/embark-mesh/embark/xds/revision"
)

// serveCertificates relays istiod's certificate service on the xDS server g
// over conn, the endpoint's connection to istiod (dialIstiod); nil conn: no
// istiod configured, and VMs get no certificate service from Embark.
// revs and sel: the CAs of the other istiod revisions, and the selector of
// each caller's revision (nil without istiod.revisions).
func serveCertificates(cfg *config.Configuration, conn *grpc.ClientConn, revs map[string]*grpc.ClientConn, sel *revision.Selector, g *grpc.Server, auth *xds.Server, reg prometheus.Registerer, log *slog.Logger) error {
	if conn == nil {
		log.Warn("no istiod configured (istiod.address): sidecars get no workload certificates from this endpoint")
		return nil
	}
	metrics, err := ca.NewMetrics(reg)
	if err != nil {
		return err
	}
	opts := ca.Options{Upstream: conn, Revisions: clientConns(revs), Authorizer: auth, MaxValidity: cfg.Istiod.MaxCertificateValidity.Duration,
		Metrics: metrics, Logger: log.With("component", "ca-relay")}
	if r := cfg.Istiod.CertificateRelay; r != nil {
		opts.Rate, opts.Burst, opts.MaxInFlight = r.RequestsPerSecond, r.Burst, r.MaxInFlight
	}
	if sel != nil {
		opts.RevisionOf = sel.OfRegistration
	}
	relay, err := ca.New(opts)
	if err != nil {
		return err
	}
	relay.Register(g)
	log.Info("relaying istiod's certificate service on the xDS address", "istiod", cfg.Istiod.Address, "serverName", cfg.Istiod.ServerName, "maxCertificateValidity", cfg.Istiod.MaxCertificateValidity.Duration)
	return nil
}
