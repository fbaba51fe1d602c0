package app

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/embark-mesh/embark/onboarding/config"
	"github.com/embark-mesh/embark/xds"
	"github.com/embark-mesh/embark/xds/ca"
	"github.com/embark-mesh/embark/xds/upstream"
)

// serveCertificates relays istiod's certificate service on the xDS server g
// when an istiod is configured; the connection to istiod closes when ctx
// ends. Standalone, VMs get no certificate service from Embark.
func serveCertificates(ctx context.Context, cfg *config.Configuration, g *grpc.Server, auth *xds.Server, reg prometheus.Registerer, log *slog.Logger) error {
	if !cfg.Istiod.Enabled() {
		log.Warn("no istiod configured (istiod.address): sidecars get no workload certificates from this endpoint")
		return nil
	}
	conn, err := upstream.Dial(ctx, upstream.Options{
		Address: cfg.Istiod.Address, ServerName: cfg.Istiod.ServerName, RootCertFile: cfg.Istiod.RootCertFile, Logger: log,
	})
	if err != nil {
		return err
	}
	context.AfterFunc(ctx, func() { _ = conn.Close() })
	metrics, err := ca.NewMetrics(reg)
	if err != nil {
		return err
	}
	relay, err := ca.New(ca.Options{Upstream: conn, Authorizer: auth, Metrics: metrics, Logger: log.With("component", "ca-relay")})
	if err != nil {
		return err
	}
	relay.Register(g)
	log.Info("relaying istiod's certificate service on the xDS address", "istiod", cfg.Istiod.Address, "serverName", cfg.Istiod.ServerName)
	return nil
}
