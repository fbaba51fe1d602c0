package app

import (
	"context"
	"fmt"
	"log/slog"

	"google.golang.org/grpc"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/registry/enforcement"
	"github.com/embark-mesh/embark/translate"
	"github.com/embark-mesh/embark/xds/configsource"
	"github.com/embark-mesh/embark/xds/relay"
	"github.com/embark-mesh/embark/xds/revision"
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

// dialRevisions opens one connection to the istiod of each of
// istiod.revisions, by revision name; the caller closes them. Their state
// is not exported as metrics (embark_istiod_connection_state is the default
// revision's); the relay's metrics carry each revision's streams.
func dialRevisions(ctx context.Context, cfg *config.Configuration, log *slog.Logger) (map[string]*grpc.ClientConn, error) {
	conns := make(map[string]*grpc.ClientConn, len(cfg.Istiod.Revisions))
	for _, r := range cfg.Istiod.Revisions {
		conn, err := upstream.Dial(ctx, upstream.Options{
			Address: r.Address, ServerName: r.ServerName, RootCertFile: cfg.Istiod.RootCertFileOf(r), Logger: log.With("istiodRevision", r.Name),
		})
		if err != nil {
			closeAll(conns)
			return nil, fmt.Errorf("istiod revision %s: %w", r.Name, err)
		}
		conns[r.Name] = conn
	}
	return conns, nil
}

// closeAll closes conns.
func closeAll(conns map[string]*grpc.ClientConn) {
	for _, c := range conns {
		_ = c.Close()
	}
}

// clientConns is conns as the relays take them.
func clientConns(conns map[string]*grpc.ClientConn) map[string]grpc.ClientConnInterface {
	if len(conns) == 0 {
		return nil
	}
	out := make(map[string]grpc.ClientConnInterface, len(conns))
	for k, c := range conns {
		out[k] = c
	}
	return out
}

// newRevisions returns the selector of each workload's istiod revision, or
// nil without istiod.revisions; it is told of every Namespace and
// WorkloadGroup change (informer events), so relayed streams follow their
// labels.
func newRevisions(ctx context.Context, b *build) (*revision.Selector, error) {
	cfg := b.cfg
	if len(cfg.Istiod.Revisions) == 0 {
		return nil, nil
	}
	names := make([]string, 0, len(cfg.Istiod.Revisions))
	for _, r := range cfg.Istiod.Revisions {
		names = append(names, r.Name)
	}
	sel, err := revision.New(ctx, revision.Options{
		Reader: b.informers, Client: b.kc, Revisions: names, Default: revision.Normal(cfg.Istiod.Revision), Writer: b.writer, Recorder: b.recorder, Logger: b.log.With("component", "istiod-revisions"),
	})
	if err != nil {
		return nil, err
	}
	if err := triggerOn(ctx, b.informers, sel.Changed, &corev1.Namespace{}, &istionetworkingv1.WorkloadGroup{}); err != nil {
		return nil, err
	}
	b.log.Info("serving several istiod revisions", "default", cfg.Istiod.Address, "revisions", names)
	return sel, nil
}

// newRelay returns the relay of istiod mode (istiod.relayXDS) over conn
// (the default revision) and revs (the others), or nil in standalone mode.
func newRelay(cfg *config.Configuration, conn *grpc.ClientConn, revs map[string]*grpc.ClientConn, reg prometheus.Registerer, log *slog.Logger) (*relay.Relay, error) {
	if !cfg.Istiod.Relays() {
		return nil, nil
	}
	m, err := relay.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	r, err := relay.New(relay.Options{Conn: conn, Revisions: clientConns(revs), Limits: subscriptionLimits(cfg), Revision: cfg.Istiod.Revision, Metrics: m, Logger: log})
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
