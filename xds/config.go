package xds

import (
	"context"
	"log/slog"
	"sync"

	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/xds/internal/snapcache"
)

// Type URLs the server treats specially.
const (
	// TypeHealthInformation is how Istio's agent reports the workload's
	// health: a request of this type, error_detail set when unhealthy. It is
	// never a subscription.
	TypeHealthInformation = "type.googleapis.com/istio.v1.HealthInformation"
	// TypeSyncz is istiod's debug type that `istioctl proxy-status` asks for.
	TypeSyncz = "istio.io/debug/syncz"
	// debugTypePrefix prefixes every Istio debug type.
	debugTypePrefix = "istio.io/debug"
	// TypeNameTable is Istio's DNS name table (NDS), which the agent asks
	// for when it captures DNS.
	TypeNameTable = "type.googleapis.com/istio.networking.nds.v1.NameTable"
	// TypeProxyConfig is Istio's proxy configuration (PCDS).
	TypeProxyConfig = "type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig"
)

// WorkloadTypes are the type URLs a workload's stream may ask for: what
// istiod serves a sidecar (pilot/pkg/xds generators: CDS, EDS, LDS, RDS,
// SDS, ECDS, NDS, PCDS) and the agent's health reports. A request of any
// other type ends the stream InvalidArgument before anything is kept for
// it, so one stream holds state for at most these few types (debug types
// are PermissionDenied: they are served only on the debug listener).
var WorkloadTypes = []string{
	resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType,
	resource.SecretType, resource.ExtensionConfigType, TypeNameTable, TypeProxyConfig,
	TypeHealthInformation,
}

// Proxy is a workload's sidecar as one of its streams describes it.
type Proxy struct {
	// Workload is the registration the stream is bound to.
	Workload registry.StreamWorkload
	// NodeID is the proxy's node ID.
	NodeID string
	// IP is the address in the node ID.
	IP string
	// Metadata holds the node metadata the server reads of the proxy
	// (CLUSTER_ID and ISTIO_VERSION, which syncz reports), not all it sent: a sidecar's
	// node metadata is several KiB per stream, and the stream's node guard
	// and relay keep the node in its encoded form.
	Metadata *structpb.Struct
	// Registration is the registration as the server last read it,
	// without its managed fields and status (which no reader of a Proxy
	// needs); do not modify it.
	Registration *runtimev1alpha1.WorkloadAutoRegistration
}

// ConfigSource computes what a proxy is served. The translation of Sidecar
// resources implements it; the server asks it when a node's first stream
// binds and on Refresh.
type ConfigSource interface {
	// Snapshot returns the proxy's whole configuration. It must not block
	// for long: it runs on the stream's goroutine.
	Snapshot(ctx context.Context, p *Proxy) (cache.ResourceSnapshot, error)
}

// NodeForgetter is implemented by a ConfigSource that keeps state per
// node: the server calls Forget once a node's last stream has closed.
type NodeForgetter interface {
	Forget(nodeID string)
}

// EmptyConfig serves every proxy an empty but valid configuration.
type EmptyConfig struct{}

var _ ConfigSource = EmptyConfig{}

// Snapshot implements ConfigSource: every proxy shares one snapshot.
func (EmptyConfig) Snapshot(context.Context, *Proxy) (cache.ResourceSnapshot, error) {
	return emptySnapshot()
}

// emptySnapshot is EmptyConfig's one snapshot, whose empty sets every node
// shares. The version map (for delta streams) is built here, before the
// cache can read it from several goroutines.
var emptySnapshot = sync.OnceValues(func() (cache.ResourceSnapshot, error) {
	snap := snapcache.NewSnapshot()
	for _, typ := range []resource.Type{resource.ClusterType, resource.ListenerType, resource.RouteType, resource.EndpointType} {
		if err := snap.SetType(typ, "empty", snapcache.NewSet(typ, nil)); err != nil {
			return nil, err
		}
	}
	if err := snap.ConstructVersionMap(); err != nil {
		return nil, err
	}
	return snap, nil
})

// Health is one health report of a workload (registry.HealthReport, the
// type registry/presence's HealthMirror takes, so that it is a HealthSink).
type Health = registry.HealthReport

// HealthSink receives the health reports of bound workloads. It must not
// block: it runs on the stream's goroutine.
type HealthSink interface {
	ReportHealth(ctx context.Context, w registry.StreamWorkload, h Health)
}

// LogHealth logs health reports (until the registry mirrors them onto the
// WorkloadEntry).
type LogHealth struct{ Logger *slog.Logger }

var _ HealthSink = LogHealth{}

// ReportHealth implements HealthSink.
func (l LogHealth) ReportHealth(ctx context.Context, w registry.StreamWorkload, h Health) {
	log := l.Logger
	if log == nil {
		log = slog.Default()
	}
	log.InfoContext(ctx, "workload health report", "registration", w.Key.String(), "healthy", h.Healthy, "message", h.Message)
}
