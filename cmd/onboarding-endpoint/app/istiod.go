package app

import (
	"context"
	"fmt"
	"log/slog"

	"google.golang.org/grpc"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/registry/enforcement"
	"github.com/embark-mesh/embark/translate"
	"github.com/embark-mesh/embark/xds/configsource"
	"github.com/embark-mesh/embark/xds/relay"
	"github.com/embark-mesh/embark/xds/upstream"
)

// dialIstiod opens the endpoint's one connection to istiod's secure port,
// shared by the certificate relay and, in istiod mode, the xDS relay; nil
// when no istiod is configured. The caller closes it. Its state and the
// expiry of istiod's roots are reported on reg.
func dialIstiod(ctx context.Context, cfg *config.Configuration, reg prometheus.Registerer, log *slog.Logger) (*grpc.ClientConn, error) {
	if !cfg.Istiod.Enabled() {
		return nil, nil
	}
	m, err := upstream.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	conn, err := upstream.Dial(ctx, upstream.Options{
		Address: cfg.Istiod.Address, ServerName: cfg.Istiod.ServerName, RootCertFile: cfg.Istiod.RootCertFile, Metrics: m, Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("istiod: %w", err)
	}
	return conn, nil
}

// newRelay returns the relay of istiod mode (istiod.relayXDS) over conn, or
// nil in standalone mode.
func newRelay(cfg *config.Configuration, conn *grpc.ClientConn, reg prometheus.Registerer, log *slog.Logger) (*relay.Relay, error) {
	if !cfg.Istiod.Relays() {
		return nil, nil
	}
	m, err := relay.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	r, err := relay.New(relay.Options{Conn: conn, Limits: subscriptionLimits(cfg), Revision: cfg.Istiod.Revision, Metrics: m, Logger: log})
	if err != nil {
		return nil, err
	}
	log.Info("istiod mode: relaying sidecar discovery requests to istiod", "istiod", cfg.Istiod.Address)
	return r, nil
}

// subscriptionLimits are the bounds of one xDS stream's subscriptions
// (limits.xds), enforced by the relay in istiod mode and by the server in
// standalone mode.
func subscriptionLimits(cfg *config.Configuration) relay.Limits {
	return relay.Limits{MaxNamesPerType: cfg.Limits.XDS.MaxSubscribedNamesPerType, MaxNameBytesPerStream: cfg.Limits.XDS.MaxSubscribedNameBytesPerStream}
}

// newConfigSource is standalone mode's configuration: translated from the
// cached Sidecars, Services, EndpointSlices, ServiceEntries and
// WorkloadEntries, whose informers it syncs first.
func newConfigSource(ctx context.Context, cfg *config.Configuration, informers cache.Cache, recorder record.EventRecorder, reg prometheus.Registerer, enforced *enforcement.ConditionWriter, log *slog.Logger) (*configsource.Source, error) {
	for _, l := range configsource.Watched() {
		if err := informers.List(ctx, l); err != nil { // starts the informer and waits for its sync
			return nil, fmt.Errorf("sync informer for %T: %w", l, err)
		}
	}
	configMetrics, err := configsource.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	return configsource.New(configsource.Options{
		Cache: informers, Mesh: translate.Mesh{TrustDomain: cfg.Mesh.TrustDomain, ClusterID: cfg.Mesh.ClusterID},
		RootNamespace: cfg.Mesh.RootNamespace, Debounce: cfg.XDS.Debounce.Duration,
		Recorder: recorder, Metrics: configMetrics, Logger: log, Enforcement: enforced,
	})
}
