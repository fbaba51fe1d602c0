package xds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	deltav3 "github.com/envoyproxy/go-control-plane/pkg/server/delta/v3"
	sotwv3 "github.com/envoyproxy/go-control-plane/pkg/server/sotw/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/nodeid"
	"github.com/embark-mesh/embark/xds/internal/snapcache"
	"github.com/embark-mesh/embark/xds/internal/watch"
	"github.com/embark-mesh/embark/xds/istiodnode"
	"github.com/embark-mesh/embark/xds/nodepin"
	"github.com/embark-mesh/embark/xds/relay"
	"github.com/embark-mesh/embark/xds/syncstate"
	"github.com/embark-mesh/embark/xds/tokenauth"
)

// Informers gives the informers the server watches (controller-runtime's
// cache.Cache satisfies it).
type Informers interface {
	GetInformer(ctx context.Context, obj client.Object, opts ...crcache.InformerGetOption) (crcache.Informer, error)
}

// Options configures a Server. Every field documents its default.
type Options struct {
	// Connections receives stream opens and closes and writes them to the
	// registrations (the registry's Connections); its replica name is the
	// control-plane ID syncz reports. Required.
	Connections ConnectionTracker
	// TokenReviews reviews sidecar tokens. Required.
	TokenReviews tokenauth.Reviewer
	// Reader reads WorkloadAutoRegistrations and the sidecar credential
	// Secrets (label registry.LabelSidecarCredential), normally from an
	// informer cache. Required.
	Reader client.Reader
	// APIReader is asked when Reader does not (yet) have an object.
	// Default: none.
	APIReader client.Reader
	// Informers notify the server of deleted registrations and Secrets, whose
	// streams it then closes. Required.
	Informers Informers
	// Audience a sidecar token must carry. Default registry.DefaultXDSAudience.
	Audience string
	// Config computes what each proxy is served. Default EmptyConfig.
	// Unused in istiod mode (Relay set).
	Config ConfigSource
	// Relay, when set, is istiod mode: every workload stream's discovery
	// requests are relayed to istiod (see package relay), which then decides
	// what the proxy is served; the server keeps authentication, liveness,
	// health reports and syncz. Default: none (standalone mode, Config).
	Relay *relay.Relay
	// Revisions, in istiod mode with several istiod revisions, chooses the
	// revision each workload stream is relayed to (Hooks.Revision of
	// package relay). Default: none, every stream goes to Relay's default
	// revision.
	Revisions RevisionSelector
	// NACKMetrics counts rejected configurations. Default: not counted.
	NACKMetrics *NACKMetrics
	// Health receives health reports. Default LogHealth.
	Health HealthSink
	// ClusterID reported in syncz when a proxy did not send CLUSTER_ID.
	// Default "Kubernetes".
	ClusterID string
	// ReviewCacheTTL is how long a positive token review is reused; a
	// negative value disables the cache. Default 10s.
	ReviewCacheTTL time.Duration
	// ReviewCacheSize bounds the cached reviews. Default 4096.
	ReviewCacheSize int
	// Metrics. Default: not recorded.
	Metrics *Metrics
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// Clock tells when a sidecar token expired (its stream is then
	// closed) and stamps ACKs. Default time.Now.
	Clock func() time.Time
	// FirstRequestTimeout is how long a workload stream may wait for its
	// first request, which names the node, before it is closed
	// DeadlineExceeded. Default DefaultFirstRequestTimeout; the endpoint
	// passes its limits.xds.firstRequestTimeout.
	FirstRequestTimeout time.Duration
	// Subscriptions bound what one workload stream may subscribe to
	// (limits.xds.maxSubscribedNamesPerType and
	// maxSubscribedNameBytesPerStream): a request over them ends the stream
	// ResourceExhausted. Standalone mode; in istiod mode the relay applies
	// its own Options.Limits. Default: relay.Limits' defaults.
	Subscriptions relay.Limits
	// Namespaces are the only namespaces whose workloads are served (the
	// configuration's workloadNamespaces; Reader watches only these): a
	// sidecar token of a service account elsewhere is refused
	// PermissionDenied naming the namespace. Default: every namespace.
	Namespaces []string
}

// DefaultFirstRequestTimeout is Options.FirstRequestTimeout's default, the
// same as the endpoint configuration's default.
const DefaultFirstRequestTimeout = 10 * time.Second

func (o *Options) setDefaults() error {
	if o.Connections == nil || o.TokenReviews == nil || o.Reader == nil || o.Informers == nil {
		return errors.New("xds: Connections, TokenReviews, Reader and Informers are required")
	}
	if o.Audience == "" {
		o.Audience = registry.DefaultXDSAudience
	}
	if o.Config == nil {
		o.Config = EmptyConfig{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Health == nil {
		o.Health = LogHealth{Logger: o.Logger}
	}
	if o.ClusterID == "" {
		o.ClusterID = "Kubernetes"
	}
	if o.ReviewCacheTTL == 0 {
		o.ReviewCacheTTL = 10 * time.Second
	}
	if o.ReviewCacheSize == 0 {
		o.ReviewCacheSize = 4096
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.FirstRequestTimeout <= 0 {
		o.FirstRequestTimeout = DefaultFirstRequestTimeout
	}
	return nil
}

// RevisionSelector chooses the istiod revision of a workload's stream
// (*revision.Selector implements it).
type RevisionSelector interface {
	// Revision returns the revision ("" the default) the stream of
	// registration key, of WorkloadGroup group, is relayed to now, and a
	// channel closed when it may have changed.
	Revision(ctx context.Context, key types.NamespacedName, group string) (string, <-chan struct{})
}

// ConnectionTracker is told which workload streams are open. The
// registry's *presence.Connections implements it.
type ConnectionTracker interface {
	// NewStreamID returns a stream ID unique in the tracker.
	NewStreamID() int64
	// Opened tells that stream id of workload w opened.
	Opened(w registry.StreamWorkload, id int64)
	// Closed tells that stream id of workload w closed.
	Closed(w registry.StreamWorkload, id int64)
	// Replica is this replica's name, the control-plane ID syncz reports.
	Replica() string
}

// Server is the ADS server. Register it on a gRPC server with Register, and
// its debug service (syncz) on a loopback-only one with RegisterDebug; Run
// watches for deleted registrations.
type Server struct {
	opts      Options
	log       *slog.Logger
	auth      *tokenauth.Authenticator
	snapshots *snapcache.Cache
	watcher   *watcher
	ctx       context.Context

	mu         sync.Mutex
	open       int                                // open streams (go-control-plane's and relayed)
	byWorkload map[types.NamespacedName][]*stream // bound workload streams (one or a few each)
	nodes      map[string]int                     // streams per node ID holding a snapshot

	relayed    atomic.Int64 // relayed streams opened so far
	subscribed atomic.Int64 // resource names standalone streams subscribe to
}

var (
	_ sotwv3.Callbacks                           = hooks{}
	_ deltav3.Callbacks                          = hooks{}
	_ discovery.AggregatedDiscoveryServiceServer = (*adsService)(nil)
	_ discovery.AggregatedDiscoveryServiceServer = (*debugService)(nil)
	_ cache.ConfigWatcher                        = (*watcher)(nil)
)

// NewServer returns a Server whose streams run until ctx ends.
func NewServer(ctx context.Context, opts Options) (*Server, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	cacheLog := opts.Logger.With("component", "snapshot-cache")
	s := &Server{
		opts: opts, log: opts.Logger, ctx: ctx,
		auth:       tokenauth.New(tokenauth.Options{Reviews: opts.TokenReviews, Audience: opts.Audience, CacheTTL: opts.ReviewCacheTTL, CacheSize: opts.ReviewCacheSize, Clock: opts.Clock}),
		snapshots:  snapcache.New(cache.NewSnapshotCache(false, cache.IDHash{}, cacheLogger{ctx, cacheLog}), cacheLog),
		byWorkload: map[types.NamespacedName][]*stream{},
		nodes:      map[string]int{},
	}
	s.watcher = &watcher{s: s}
	return s, nil
}

// TokenIssued remembers a sidecar token the registrar has just received
// from the API server as reviewed (registry.SidecarCredentialOptions.Issued).
func (s *Server) TokenIssued(token string, audiences []string) {
	s.auth.Issued(token, audiences)
}

// Register adds the authenticated ADS service to g.
func (s *Server) Register(g *grpc.Server) {
	discovery.RegisterAggregatedDiscoveryServiceServer(g, &adsService{s: s})
}

// RegisterDebug adds the debug ADS service (istio.io/debug/syncz, no
// authentication) to g. Serve g only on a loopback address (see
// CheckLoopback): whoever reaches it learns which workloads are connected.
func (s *Server) RegisterDebug(g *grpc.Server) {
	discovery.RegisterAggregatedDiscoveryServiceServer(g, &debugService{s: s})
}

// CheckLoopback fails unless addr ([host]:port) listens on loopback only.
func CheckLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("debug listen address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.IsLoopback() {
		return fmt.Errorf("debug listen address %q must be a loopback address (127.0.0.1, ::1 or localhost): it serves unauthenticated debug data", addr)
	}
	return nil
}

// Run closes the streams of registrations (and sidecar Secrets) as they are
// deleted, until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	var handlers watch.Handlers
	defer handlers.RemoveAll()
	for _, w := range []struct {
		obj     client.Object
		deleted func(client.Object)
	}{
		{&runtimev1alpha1.WorkloadAutoRegistration{}, func(o client.Object) {
			s.closeWorkload(types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}, o.GetUID())
		}},
		{&corev1.Secret{}, func(o client.Object) {
			s.auth.Forget(o.GetUID())
			s.closeSecret(o.GetUID())
		}},
	} {
		deleted := w.deleted
		err := handlers.Add(ctx, s.opts.Informers, w.obj, toolscache.ResourceEventHandlerFuncs{
			UpdateFunc: func(_, obj any) {
				if o, ok := obj.(client.Object); ok && o.GetDeletionTimestamp() != nil {
					deleted(o)
				}
			},
			DeleteFunc: func(obj any) {
				if o := watch.Deleted(obj); o != nil {
					deleted(o)
				}
			},
		})
		if err != nil {
			return err
		}
	}
	<-ctx.Done()
	return nil
}

// Refresh recomputes the configuration of every node of the registrations
// keys from the ConfigSource (the translation calls it when inputs change).
// Every configuration is computed first, by one worker per CPU (translation
// is CPU-bound and the proxies' configurations are independent), then all
// are set at once: the streams send while nothing else competes for the
// CPUs, and their writes to a connection are batched, instead of each send
// waiting behind the computations still to come (see benchmarks/push and
// docs/translate.md).
func (s *Server) Refresh(ctx context.Context, keys ...types.NamespacedName) {
	proxies := s.proxiesOf(keys)
	snaps := make([]cache.ResourceSnapshot, len(proxies))
	next := atomic.Int64{}
	var workers sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(proxies)) {
		workers.Go(func() {
			for i := int(next.Add(1) - 1); i < len(proxies); i = int(next.Add(1) - 1) {
				snap, err := s.opts.Config.Snapshot(ctx, proxies[i])
				if err != nil {
					s.log.Error("refresh proxy configuration", "node", proxies[i].NodeID, "error", err)
					continue
				}
				snaps[i] = snap
			}
		})
	}
	workers.Wait()
	for i, p := range proxies {
		if snaps[i] == nil {
			continue
		}
		var err error
		switch cur := s.currentProxy(p); {
		case cur == p:
			err = s.publish(ctx, p, snaps[i])
		case cur != nil:
			// The stream p came from closed while the others were computed
			// and the node reconnected: what was computed for p (perhaps
			// another registration of the workload) must not replace what
			// the new stream was given; compute for the stream it has now.
			err = s.setSnapshot(ctx, cur)
		}
		if err != nil {
			s.log.Error("refresh proxy configuration", "node", p.NodeID, "error", err)
		}
	}
}

// currentProxy is p when a stream of p's node still holds it, else the
// proxy of another stream of the node bound to the same registration key
// (nil: none, the node is gone).
func (s *Server) currentProxy(p *Proxy) *Proxy {
	s.mu.Lock()
	defer s.mu.Unlock()
	var other *Proxy
	for _, st := range s.byWorkload[p.Workload.Key] {
		switch {
		case st.proxy == p:
			return p
		case other == nil && st.proxy.NodeID == p.NodeID:
			other = st.proxy
		}
	}
	return other
}

// proxiesOf are the proxies of the registrations keys, each node once.
func (s *Server) proxiesOf(keys []types.NamespacedName) []*Proxy {
	s.mu.Lock()
	defer s.mu.Unlock()
	var proxies []*Proxy
	seen := map[string]bool{}
	for _, key := range keys {
		for _, st := range s.byWorkload[key] {
			if !seen[st.proxy.NodeID] {
				seen[st.proxy.NodeID] = true
				proxies = append(proxies, st.proxy)
			}
		}
	}
	return proxies
}

// stream is one ADS stream as the server knows it.
type stream struct {
	proxy     *Proxy // nil on debug streams
	secretUID types.UID
	expires   time.Time // the token's expiry; zero on debug streams
	opened    time.Time
	connID    int64 // the connection tracker's ID of a counted stream
	debug     bool
	counted   bool // a workload's sidecar (not a debug client): counts as connected
	// upstream is, in istiod mode, the node relayed to istiod, built at
	// admission; the relay takes it (relayNode) with the first request.
	upstream *core.Node

	// ctx ends when the server closes the stream (close) or the server's
	// context ends: the stream's handler (go-control-plane's or the
	// relay's) returns then.
	ctx    context.Context
	cancel context.CancelFunc

	mu sync.Mutex
	// Why the server closed it: set by close before ctx ends; reason
	// (a metrics label) is empty while it did not.
	code   codes.Code
	reason string
	msg    string
	acks   syncstate.Types // per type asked for (a few: see WorkloadTypes)
}

// newStream returns a stream that lives at most as long as the server.
// Whoever serves it calls st.cancel when done.
func (s *Server) newStream() *stream {
	st := &stream{}
	st.ctx, st.cancel = context.WithCancel(s.ctx)
	return st
}

// close ends the stream with status code and msg; reason labels it in
// metrics. The first close wins.
func (st *stream) close(code codes.Code, reason, msg string) {
	st.mu.Lock()
	if st.reason == "" {
		st.code, st.reason, st.msg = code, reason, msg
	}
	st.mu.Unlock()
	st.cancel()
}

// closedBy returns why the server closed st; reason is empty if it did not.
func (st *stream) closedBy() (code codes.Code, reason, msg string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.code, st.reason, st.msg
}

func (st *stream) closeDeleted() {
	st.close(codes.Unavailable, closeRegistrationDeleted, "its WorkloadAutoRegistration was deleted; onboard again")
}

// admit authenticates a workload stream and binds it to its registration.
// A refusal changes no state.
func (s *Server) admit(ctx context.Context, node *core.Node) (*stream, error) {
	_, cred, err := s.authenticated(ctx, "xDS stream")
	if err != nil {
		return nil, err
	}
	proxy, err := s.authorize(ctx, cred, node)
	if err != nil {
		s.log.Info("refused xDS stream", "node", node.GetId(), "serviceAccount", cred.ServiceAccount.String(), "reason", err.Error())
		return nil, err
	}
	st := s.newStream()
	if s.opts.Relay != nil {
		if st.upstream, err = s.istiodNode(node, proxy.Registration); err != nil {
			st.cancel()
			s.log.Info("refused xDS stream", "node", node.GetId(), "serviceAccount", cred.ServiceAccount.String(), "reason", err.Error())
			return nil, err
		}
	}
	st.proxy = proxy
	st.secretUID = cred.SecretUID
	st.expires = cred.Expires
	_, st.counted = node.GetMetadata().GetFields()["PROXY_CONFIG"]
	return st, nil
}

// authenticated reviews the bearer token of ctx, a request of kind (named
// in the log of a refusal), and returns the token and what it proves.
func (s *Server) authenticated(ctx context.Context, kind string) (string, *tokenauth.Credential, error) {
	raw, err := tokenauth.BearerToken(ctx)
	if err != nil {
		return "", nil, refuse(codes.Unauthenticated, tokenauth.Reason(err), "%v", err)
	}
	cred, err := s.auth.Authenticate(ctx, raw)
	switch {
	case errors.Is(err, tokenauth.ErrReviewFailed):
		s.log.Error("review sidecar token", "error", err)
		return "", nil, refuse(codes.Unavailable, tokenauth.ReasonReviewFailed, "%v", err)
	case err != nil:
		s.log.Info("refused "+kind, "reason", err.Error())
		return "", nil, refuse(codes.Unauthenticated, tokenauth.Reason(err), "%v", err)
	}
	return raw, cred, nil
}

// authorize checks that the node ID names the registration whose Secret the
// credential is bound to.
func (s *Server) authorize(ctx context.Context, cred *tokenauth.Credential, node *core.Node) (*Proxy, error) {
	denied := func(reason, format string, args ...any) error {
		return refuse(codes.PermissionDenied, reason, format, args...)
	}
	info, err := nodeid.Parse(node.GetId())
	if err != nil {
		return nil, denied(reasonBadNodeID, "%v", err)
	}
	key := info.Registration
	if cred.ServiceAccount.Namespace != key.Namespace || cred.SecretName != registry.SidecarSecretName(key.Name) {
		return nil, denied(reasonOtherWorkload, "the sidecar token is bound to Secret %s/%s, not to the credential of registration %s named by node ID %q",
			cred.ServiceAccount.Namespace, cred.SecretName, key, node.GetId())
	}
	war, err := s.credentialRegistration(ctx, cred, key)
	if err != nil {
		return nil, err
	}
	// The node ID's address is the one istiod takes the proxy's for (when
	// no other metadata names one): it must be the registration's workload
	// address, the one its identity or an addressCIDRs rule proved at every
	// Register and its WorkloadEntry holds, not any host address it listed.
	addr, err := registry.WorkloadAddress(war.Spec.Registration)
	if err != nil {
		return nil, denied(reasonAddress, "registration %s: %v", key, err)
	}
	if info.IP != addr {
		return nil, denied(reasonAddress, "node ID address %s is not the proven workload address %s of registration %s", info.IP, addr, key)
	}
	// The stream keeps this copy while it lives: without the managed
	// fields and the status, which no reader of a Proxy needs (most of the
	// object once its status was written).
	war.ManagedFields = nil
	war.Status = runtimev1alpha1.WorkloadAutoRegistrationStatus{}
	return &Proxy{
		Workload:     registry.StreamWorkload{Key: key, UID: war.UID, Group: war.Spec.WorkloadGroup.Name},
		NodeID:       node.GetId(),
		IP:           info.IP,
		Metadata:     keptMetadata(node.GetMetadata()),
		Registration: war,
	}, nil
}

// istiodNode is the node relayed to istiod for a stream of war whose first
// request carried node (see package istiodnode): built from war, with only
// the harmless metadata of node.
func (s *Server) istiodNode(node *core.Node, war *runtimev1alpha1.WorkloadAutoRegistration) (*core.Node, error) {
	up, err := istiodnode.Build(node, war, s.opts.ClusterID)
	switch {
	case errors.Is(err, istiodnode.ErrMetadata):
		return nil, refuse(codes.InvalidArgument, reasonBadMetadata, "%v", err)
	case err != nil:
		return nil, refuse(codes.Internal, reasonInternal, "%v", err)
	}
	return up, nil
}

// proxyMetadataKeys are the node metadata a Proxy keeps (what syncz reports).
var proxyMetadataKeys = []string{"CLUSTER_ID", "ISTIO_VERSION"}

// keptMetadata returns the fields of md that a Proxy keeps, sharing their
// values.
func keptMetadata(md *structpb.Struct) *structpb.Struct {
	out := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(proxyMetadataKeys))}
	for _, k := range proxyMetadataKeys {
		if v, ok := md.GetFields()[k]; ok {
			out.Fields[k] = v
		}
	}
	return out
}

// credentialRegistration checks that cred, a reviewed sidecar token, belongs to the
// live registration key: the Secret the token is bound to is that
// registration's current credential Secret, and the token's service account
// is the one the registration runs as. Both the xDS streams and the
// certificate requests of a sidecar are authorized by it.
func (s *Server) credentialRegistration(ctx context.Context, cred *tokenauth.Credential, key types.NamespacedName) (*runtimev1alpha1.WorkloadAutoRegistration, error) {
	denied := func(reason, format string, args ...any) error {
		return refuse(codes.PermissionDenied, reason, format, args...)
	}
	if err := s.served(key.Namespace); err != nil {
		return nil, err
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := s.get(ctx, key, war); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, denied(reasonUnknownRegistration, "registration %s does not exist; onboard again", key)
		}
		return nil, refuse(codes.Unavailable, reasonUnavailable, "read registration %s: %v", key, err)
	}
	if war.DeletionTimestamp != nil {
		return nil, denied(reasonRegistrationDeleted, "registration %s is being deleted; onboard again", key)
	}
	secret := &corev1.Secret{}
	if err := s.get(ctx, types.NamespacedName{Namespace: key.Namespace, Name: cred.SecretName}, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, denied(reasonStaleCredential, "the sidecar credential Secret %s/%s does not exist", key.Namespace, cred.SecretName)
		}
		return nil, refuse(codes.Unavailable, reasonUnavailable, "read Secret %s/%s: %v", key.Namespace, cred.SecretName, err)
	}
	ref := metav1.GetControllerOf(secret)
	if secret.UID != cred.SecretUID || ref == nil || ref.Kind != "WorkloadAutoRegistration" || ref.UID != war.UID {
		return nil, denied(reasonStaleCredential, "the sidecar token is bound to another incarnation of Secret %s/%s than registration %s owns", key.Namespace, cred.SecretName, key)
	}
	group, err := registry.GroupSpec(war.Spec.WorkloadGroup)
	if err != nil {
		return nil, refuse(codes.Internal, reasonInternal, "%v", err)
	}
	if sa := registry.ServiceAccountOf(group.GetTemplate().GetServiceAccount()); sa != cred.ServiceAccount.Name {
		return nil, denied(reasonServiceAccount, "the sidecar token is of service account %s, registration %s runs as %s", cred.ServiceAccount, key, sa)
	}
	return war, nil
}

// get reads from the cache, then from the API server when the cache has not
// seen the object yet.
func (s *Server) get(ctx context.Context, key types.NamespacedName, obj client.Object) error {
	err := s.opts.Reader.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) && s.opts.APIReader != nil {
		err = s.opts.APIReader.Get(ctx, key, obj)
	}
	return err
}

// attach makes st known as a stream of its workload and makes sure its node
// has a snapshot.
func (s *Server) attach(ctx context.Context, st *stream) error {
	key := st.proxy.Workload.Key
	s.mu.Lock()
	s.byWorkload[key] = append(s.byWorkload[key], st)
	s.nodes[st.proxy.NodeID]++
	s.mu.Unlock()
	if _, err := s.snapshots.GetSnapshot(st.proxy.NodeID); err != nil && s.opts.Relay == nil {
		if err := s.setSnapshot(ctx, st.proxy); err != nil {
			// Not a reason to refuse the stream: serve an empty valid
			// configuration until the next refresh.
			s.log.Error("compute configuration; serving an empty one", "node", st.proxy.NodeID, "error", err)
			empty, _ := EmptyConfig{}.Snapshot(ctx, st.proxy)
			if err := s.snapshots.SetSnapshot(ctx, st.proxy.NodeID, empty); err != nil {
				return status.Errorf(codes.Internal, "set configuration: %v", err)
			}
		}
	}
	// The registration may have been deleted between authorize and now,
	// before its deletion could find this stream.
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := s.opts.Reader.Get(ctx, key, war); err == nil && (war.UID != st.proxy.Workload.UID || war.DeletionTimestamp != nil) {
		st.closeDeleted()
	}
	return nil
}

func (s *Server) detach(st *stream) {
	key := st.proxy.Workload.Key
	node := st.proxy.NodeID
	s.mu.Lock()
	if set := slices.DeleteFunc(s.byWorkload[key], func(o *stream) bool { return o == st }); len(set) > 0 {
		s.byWorkload[key] = set
	} else {
		delete(s.byWorkload, key)
	}
	gone := false
	if s.nodes[node]--; s.nodes[node] <= 0 {
		delete(s.nodes, node)
		s.snapshots.ClearSnapshot(node) // no sends: safe under s.mu
		gone = true
	}
	s.mu.Unlock()
	if f, ok := s.opts.Config.(NodeForgetter); ok && gone {
		f.Forget(node)
	}
}

func (s *Server) setSnapshot(ctx context.Context, p *Proxy) error {
	snap, err := s.opts.Config.Snapshot(ctx, p)
	if err != nil {
		return fmt.Errorf("configuration of %s: %w", p.NodeID, err)
	}
	return s.publish(ctx, p, snap)
}

// publish sets p's node's snapshot: its streams send what changed.
func (s *Server) publish(ctx context.Context, p *Proxy, snap cache.ResourceSnapshot) error {
	if err := s.snapshots.SetSnapshot(ctx, p.NodeID, snap); err != nil {
		return err
	}
	// The node's last stream may have detached while this was computed.
	s.mu.Lock()
	gone := s.nodes[p.NodeID] == 0
	if gone {
		s.snapshots.ClearSnapshot(p.NodeID)
	}
	s.mu.Unlock()
	return nil
}

func (s *Server) closeWorkload(key types.NamespacedName, uid types.UID) {
	s.mu.Lock()
	var victims []*stream
	for _, st := range s.byWorkload[key] {
		if uid == "" || st.proxy.Workload.UID == uid {
			victims = append(victims, st)
		}
	}
	s.mu.Unlock()
	for _, st := range victims {
		s.log.Info("closing xDS stream: its registration was deleted", "registration", key.String())
		st.closeDeleted()
	}
}

func (s *Server) closeSecret(uid types.UID) {
	s.mu.Lock()
	var victims []*stream
	for _, set := range s.byWorkload {
		for _, st := range set {
			if st.secretUID == uid {
				victims = append(victims, st)
			}
		}
	}
	s.mu.Unlock()
	for _, st := range victims {
		st.close(codes.Unavailable, closeCredentialDeleted, "its sidecar credential Secret was deleted; onboard again")
	}
}

// serveStream runs one admitted workload stream (or a debug stream) with
// handle, the handler's single reader reading the client itself through
// the stream's node guard (no goroutine of the server's own per stream).
// The handler ends when the client does or when st.ctx ends: the server
// closed the stream, or the server's context ended.
func serveStream[Req, Resp any](s *Server, ss grpc.BidiStreamingServer[Req, Resp], st *stream, first *Req, handle func(*boundStream[Req, Resp]) error) error {
	defer st.cancel()
	if !st.expires.IsZero() {
		// The stream lives no longer than the credential that opened it:
		// the agent reconnects with the fresh token of its token file.
		exp := st.expires
		t := time.AfterFunc(exp.Sub(s.opts.Clock()), func() {
			s.log.Info("closing xDS stream: its sidecar token expired", "registration", st.proxy.Workload.Key.String(), "expired", exp)
			st.close(codes.Unauthenticated, closeCredentialExpired, "the sidecar token expired at "+exp.UTC().Format(time.RFC3339)+"; reconnect with a fresh token")
		})
		defer t.Stop()
	}
	err := handle(newBoundStream(ss, first, st))
	if code, reason, msg := st.closedBy(); reason != "" {
		s.opts.Metrics.closedByServer(reason)
		return status.Errorf(code, "stream closed by the server: %s", msg)
	}
	if errors.Is(err, relay.ErrStopped) {
		return nil // the server's context ended, as go-control-plane's handler then does
	}
	return err
}

// recvFirst waits for the first request of a workload stream at most
// FirstRequestTimeout: a client that opens streams and sends nothing holds
// them no longer. When it gives up, the handler returns, which ends the
// stream and the receiving goroutine with it.
func recvFirst[Req, Resp any](s *Server, ss grpc.BidiStreamingServer[Req, Resp]) (*Req, error) {
	type result struct {
		req *Req
		err error
	}
	got := make(chan result, 1)
	go func() {
		r, err := ss.Recv()
		got <- result{r, err}
	}()
	t := time.NewTimer(s.opts.FirstRequestTimeout)
	defer t.Stop()
	select {
	case r := <-got:
		return r.req, r.err
	case <-t.C:
		return nil, s.opts.Metrics.refusedStream(refuse(codes.DeadlineExceeded, reasonNoFirstRequest, "no request within %s of opening the stream", s.opts.FirstRequestTimeout))
	}
}

// adsService is the authenticated ADS service.
type adsService struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	s *Server
}

// StreamAggregatedResources serves a SotW ADS stream.
func (a *adsService) StreamAggregatedResources(ss discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return serveADS(a.s, sotw, ss)
}

// DeltaAggregatedResources serves a Delta ADS stream.
func (a *adsService) DeltaAggregatedResources(ss discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	return serveADS(a.s, delta, ss)
}

// serveADS serves an authenticated workload stream of protocol p: the
// first request names the node, admission binds the stream to its
// registration, then go-control-plane (standalone mode) or the relay
// (istiod mode) serves it.
func serveADS[Req, Resp any](s *Server, p *protocol[Req, Resp], ss grpc.BidiStreamingServer[Req, Resp]) error {
	if _, err := tokenauth.BearerToken(ss.Context()); err != nil {
		return s.opts.Metrics.refusedStream(refuse(codes.Unauthenticated, tokenauth.Reason(err), "%v", err))
	}
	first, err := recvFirst(s, ss)
	if err != nil {
		return err
	}
	st, err := s.admit(ss.Context(), p.request(first).node)
	if err != nil {
		return s.opts.Metrics.refusedStream(err)
	}
	if err := s.attach(ss.Context(), st); err != nil {
		s.detach(st)
		st.cancel()
		return err
	}
	defer s.detach(st)
	return serveStream(s, ss, st, first, func(bs *boundStream[Req, Resp]) error {
		if s.opts.Relay != nil {
			return relayed(s, p, bs, st)
		}
		subs := &streamSubscriptions[Req]{subs: p.subscriptions(s.opts.Subscriptions, &s.subscribed)}
		bs.subs = subs
		defer subs.Release()
		return p.serve(st.ctx, s.watcher, hooks{s, st}, bs)
	})
}

// streamSubscriptions guards a standalone stream's subscriptions:
// go-control-plane receives on a goroutine of its own, which may still be
// in Observe when the stream's handler returns and releases them. A
// request observed after the release keeps nothing (the stream has ended),
// so the server's count of subscribed names goes back to what it was.
type streamSubscriptions[Req any] struct {
	mu       sync.Mutex
	subs     relay.Subscriptions[Req]
	released bool
}

func (s *streamSubscriptions[Req]) Observe(r *Req) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.released {
		return nil
	}
	return s.subs.Observe(r)
}

func (s *streamSubscriptions[Req]) Names() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.subs.Names()
}

func (s *streamSubscriptions[Req]) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.released {
		s.released = true
		s.subs.Release()
	}
}

// debugService serves istio.io/debug/syncz without authentication.
type debugService struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	s *Server
}

// StreamAggregatedResources serves a SotW debug stream.
func (d *debugService) StreamAggregatedResources(ss discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	st := d.s.newStream()
	st.debug = true
	return serveStream(d.s, ss, st, nil, func(bs *boundStream[discovery.DiscoveryRequest, discovery.DiscoveryResponse]) error {
		return sotw.serve(st.ctx, d.s.watcher, hooks{d.s, st}, bs)
	})
}

// boundStream hands the stream's handler (go-control-plane's or the
// relay's) a stream whose requests all carry the first request's node (or
// none): its single reader, Recv, checks every request with the node guard
// before the handler or the callbacks see it, and, in standalone mode, with
// the stream's subscription limits.
type boundStream[Req, Resp any] struct {
	grpc.BidiStreamingServer[Req, Resp]
	first *Req
	st    *stream
	guard nodepin.Guard
	subs  relay.Subscriptions[Req] // standalone mode; nil: not checked here
}

func newBoundStream[Req, Resp any](ss grpc.BidiStreamingServer[Req, Resp], first *Req, st *stream) *boundStream[Req, Resp] {
	b := &boundStream[Req, Resp]{BidiStreamingServer: ss, first: first, st: st}
	if first != nil {
		b.guard.Pin(nodepin.RequestNode(first))
	}
	return b
}

// Recv returns the first request (already read), then what the client
// sends, until the client ends the stream or a request carries another node
// than the first (the stream is then closed PermissionDenied before
// anything else sees that request) or subscribes over the stream's limits
// (closed ResourceExhausted). Only the handler's single receiving
// goroutine calls it.
func (b *boundStream[Req, Resp]) Recv() (*Req, error) {
	r := b.first
	if r != nil {
		b.first = nil
	} else {
		var err error
		if r, err = b.BidiStreamingServer.Recv(); err != nil {
			return nil, err
		}
		if err := b.guard.Check(r); err != nil {
			return nil, b.refuse(codes.PermissionDenied, closeNodeSwitched, err.Error())
		}
	}
	if b.subs != nil {
		if err := b.subs.Observe(r); err != nil {
			return nil, b.refuse(codes.ResourceExhausted, closeSubscriptionLimit, status.Convert(err).Message())
		}
	}
	return r, nil
}

// refuse closes the stream: code, reason (a metrics label) and msg are its
// status.
func (b *boundStream[Req, Resp]) refuse(code codes.Code, reason, msg string) error {
	refused := &refusal{code: code, reason: reason, msg: msg}
	b.st.close(refused.code, refused.reason, refused.msg)
	return refused
}

// State counts what the server holds: open streams, bound workloads, nodes
// with a snapshot, the snapshot cache's per-node status entries, and the
// resource names its streams subscribe to (standalone streams' and the
// relay's).
type State struct {
	Streams, Workloads, Nodes, CacheStatuses int
	SubscribedNames                          int64
}

// State returns what the server holds now.
func (s *Server) State() State {
	names := s.subscribed.Load()
	if s.opts.Relay != nil {
		names += s.opts.Relay.SubscribedNames()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return State{Streams: s.open, Workloads: len(s.byWorkload), Nodes: len(s.nodes), CacheStatuses: len(s.snapshots.GetStatusKeys()), SubscribedNames: names}
}
