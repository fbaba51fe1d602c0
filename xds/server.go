package xds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
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
	"github.com/embark-mesh/embark/onboarding/limits"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/nodeid"
	"github.com/embark-mesh/embark/registry/presence"
	"github.com/embark-mesh/embark/xds/relay"
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
	TokenReviews TokenReviewer
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
	// DeadlineExceeded. Default limits.DefaultFirstRequestTimeout (10s).
	FirstRequestTimeout time.Duration
	// Namespaces are the only namespaces whose workloads are served (the
	// configuration's workloadNamespaces; Reader watches only these): a
	// sidecar token of a service account elsewhere is refused
	// PermissionDenied naming the namespace. Default: every namespace.
	Namespaces []string
}

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
		o.FirstRequestTimeout = limits.DefaultFirstRequestTimeout
	}
	return nil
}

// ConnectionTracker is told which workload streams are open. The
// registry's *presence.Connections implements it.
type ConnectionTracker interface {
	// NewStreamID returns a stream ID unique in the tracker.
	NewStreamID() int64
	// Opened tells that stream id of workload w opened.
	Opened(w presence.Workload, id int64)
	// Closed tells that stream id of workload w closed.
	Closed(w presence.Workload, id int64)
	// Replica is this replica's name, the control-plane ID syncz reports.
	Replica() string
}

var _ ConnectionTracker = (*presence.Connections)(nil)

// Server is the ADS server. Register it on a gRPC server with Register, and
// its debug service (syncz) on a loopback-only one with RegisterDebug; Run
// watches for deleted registrations.
type Server struct {
	opts      Options
	log       *slog.Logger
	auth      *authenticator
	snapshots cache.SnapshotCache
	xds       serverv3.Server
	ctx       context.Context

	mu         sync.Mutex
	streams    map[streamRef]*stream              // open streams
	byWorkload map[types.NamespacedName][]*stream // bound workload streams (one or a few each)
	nodes      map[string]int                     // streams per node ID holding a snapshot

	relayIDs atomic.Int64 // numbers relayed streams in streams
}

var (
	_ serverv3.Callbacks                         = serverv3.CallbackFuncs{}
	_ discovery.AggregatedDiscoveryServiceServer = (*adsService)(nil)
	_ discovery.AggregatedDiscoveryServiceServer = (*debugService)(nil)
	_ cache.Cache                                = (*watcher)(nil)
)

// NewServer returns a Server whose streams run until ctx ends.
func NewServer(ctx context.Context, opts Options) (*Server, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	s := &Server{
		opts: opts, log: opts.Logger, ctx: ctx,
		auth:       newAuthenticator(opts.TokenReviews, opts.Audience, opts.ReviewCacheTTL, opts.ReviewCacheSize, opts.Clock),
		snapshots:  cache.NewSnapshotCache(false, cache.IDHash{}, cacheLogger{ctx, opts.Logger.With("component", "snapshot-cache")}),
		streams:    map[streamRef]*stream{},
		byWorkload: map[types.NamespacedName][]*stream{},
		nodes:      map[string]int{},
	}
	s.xds = serverv3.NewServer(ctx, &watcher{s: s}, s.callbacks())
	return s, nil
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
	type handle struct {
		inf crcache.Informer
		reg toolscache.ResourceEventHandlerRegistration
	}
	var handles []handle
	defer func() {
		for _, h := range handles {
			_ = h.inf.RemoveEventHandler(h.reg)
		}
	}()
	for _, w := range []struct {
		obj     client.Object
		deleted func(client.Object)
	}{
		{&runtimev1alpha1.WorkloadAutoRegistration{}, func(o client.Object) {
			s.closeWorkload(types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}, o.GetUID())
		}},
		{&corev1.Secret{}, func(o client.Object) {
			s.auth.forget(o.GetUID())
			s.closeSecret(o.GetUID())
		}},
	} {
		inf, err := s.opts.Informers.GetInformer(ctx, w.obj)
		if err != nil {
			return fmt.Errorf("watch %T: %w", w.obj, err)
		}
		deleted := w.deleted
		reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			UpdateFunc: func(_, obj any) {
				if o, ok := obj.(client.Object); ok && o.GetDeletionTimestamp() != nil {
					deleted(o)
				}
			},
			DeleteFunc: func(obj any) {
				if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
					obj = t.Obj
				}
				if o, ok := obj.(client.Object); ok {
					deleted(o)
				}
			},
		})
		if err != nil {
			return fmt.Errorf("watch %T: %w", w.obj, err)
		}
		handles = append(handles, handle{inf, reg})
	}
	<-ctx.Done()
	return nil
}

// Refresh recomputes the configuration of every node of the registration
// key from the ConfigSource (the translation calls it when inputs change).
func (s *Server) Refresh(ctx context.Context, key types.NamespacedName) {
	s.mu.Lock()
	var proxies []*Proxy
	seen := map[string]bool{}
	for _, st := range s.byWorkload[key] {
		if !seen[st.proxy.NodeID] {
			seen[st.proxy.NodeID] = true
			proxies = append(proxies, st.proxy)
		}
	}
	s.mu.Unlock()
	for _, p := range proxies {
		if err := s.setSnapshot(ctx, p); err != nil {
			s.log.Error("refresh proxy configuration", "node", p.NodeID, "error", err)
		}
	}
}

// stream is one ADS stream as the server knows it.
type stream struct {
	debug     bool
	proxy     *Proxy // nil on debug streams
	counted   bool   // a workload's sidecar (not a debug client): counts as connected
	secretUID types.UID
	expires   time.Time // the token's expiry; zero on debug streams
	opened    time.Time
	connID    int64 // the connection tracker's ID of a counted stream

	killOnce sync.Once
	kill     chan struct{}
	// Why the server closed it: set before kill is closed.
	code   codes.Code
	reason string // metrics label
	msg    string

	mu   sync.Mutex
	acks []typeState // per type asked for (a few: see WorkloadTypes)
}

func newStream() *stream {
	return &stream{kill: make(chan struct{})}
}

// close ends the stream with status code and msg; reason labels it in
// metrics.
func (st *stream) close(code codes.Code, reason, msg string) {
	st.killOnce.Do(func() {
		st.code, st.reason, st.msg = code, reason, msg
		close(st.kill)
	})
}

func (st *stream) closeDeleted() {
	st.close(codes.Unavailable, closeRegistrationDeleted, "its WorkloadAutoRegistration was deleted; onboard again")
}

type streamKey struct{}

func withStream(ctx context.Context, st *stream) context.Context {
	return context.WithValue(ctx, streamKey{}, st)
}

func streamFrom(ctx context.Context) *stream {
	st, _ := ctx.Value(streamKey{}).(*stream)
	return st
}

// admit authenticates a workload stream and binds it to its registration.
// A refusal changes no state.
func (s *Server) admit(ctx context.Context, node *core.Node) (*stream, error) {
	raw, err := bearerToken(ctx)
	if err != nil {
		return nil, refuse(codes.Unauthenticated, authReason(err), "%v", err)
	}
	cred, err := s.auth.authenticate(ctx, raw)
	switch {
	case errors.Is(err, errReviewFailed):
		s.log.Error("review sidecar token", "error", err)
		return nil, refuse(codes.Unavailable, reasonReviewFailed, "%v", err)
	case err != nil:
		s.log.Info("refused xDS stream", "reason", err.Error())
		return nil, refuse(codes.Unauthenticated, authReason(err), "%v", err)
	}
	proxy, err := s.authorize(ctx, cred, node)
	if err != nil {
		s.log.Info("refused xDS stream", "node", node.GetId(), "serviceAccount", cred.ServiceAccount.String(), "reason", err.Error())
		return nil, err
	}
	st := newStream()
	st.proxy = proxy
	st.secretUID = cred.SecretUID
	st.expires = cred.Expires
	_, st.counted = node.GetMetadata().GetFields()["PROXY_CONFIG"]
	return st, nil
}

// authorize checks that the node ID names the registration whose Secret the
// credential is bound to.
func (s *Server) authorize(ctx context.Context, cred *Credential, node *core.Node) (*Proxy, error) {
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
	war, err := s.registrationOf(ctx, cred, key)
	if err != nil {
		return nil, err
	}
	if !slices.ContainsFunc(war.Spec.Registration.Host.Addresses, func(a runtimev1alpha1.HostAddress) bool { return a.IP == info.IP }) {
		return nil, denied(reasonAddress, "node ID address %s is not an address of registration %s", info.IP, key)
	}
	// The stream keeps this copy while it lives: without the managed
	// fields, which no reader of a Proxy needs (a third of the object
	// once its status was written).
	war.ManagedFields = nil
	return &Proxy{
		Workload:     presence.Workload{Key: key, UID: war.UID, Group: war.Spec.WorkloadGroup.Name},
		NodeID:       node.GetId(),
		IP:           info.IP,
		Metadata:     keptMetadata(node.GetMetadata()),
		Registration: war,
	}, nil
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

// registrationOf checks that cred, a reviewed sidecar token, belongs to the
// live registration key: the Secret the token is bound to is that
// registration's current credential Secret, and the token's service account
// is the one the registration runs as. Both the xDS streams and the
// certificate requests of a sidecar are authorized by it.
func (s *Server) registrationOf(ctx context.Context, cred *Credential, key types.NamespacedName) (*runtimev1alpha1.WorkloadAutoRegistration, error) {
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
// handle. With direct, handle's single reader reads the client itself
// (Recv checks the node guard) and handle ends when the server closes the
// stream (st.kill) by itself: the relay's way, one goroutine fewer per
// stream. Without, a pump goroutine reads the client, and Recv ends when the
// server closes the stream: go-control-plane's way.
func serveStream[Req, Resp any](s *Server, ss grpc.BidiStreamingServer[Req, Resp], st *stream, first *Req, direct bool, handle func(*boundStream[Req, Resp]) error) error {
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
	bs := newBoundStream(ss, withStream(ss.Context(), st), first, st, direct)
	if !direct {
		go bs.pump()
	}
	err := handle(bs)
	select {
	case <-st.kill:
		s.opts.Metrics.closedByServer(st.reason)
		return status.Errorf(st.code, "stream closed by the server: %s", st.msg)
	default:
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
	if _, err := bearerToken(ss.Context()); err != nil {
		return s.opts.Metrics.refusedStream(refuse(codes.Unauthenticated, authReason(err), "%v", err))
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
		return err
	}
	defer s.detach(st)
	return serveStream(s, ss, st, first, s.opts.Relay != nil, func(bs *boundStream[Req, Resp]) error {
		if s.opts.Relay != nil {
			return relayed(s, p, bs, st)
		}
		return p.serve(s.xds, bs)
	})
}

// debugService serves istio.io/debug/syncz without authentication.
type debugService struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	s *Server
}

// StreamAggregatedResources serves a SotW debug stream.
func (d *debugService) StreamAggregatedResources(ss discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	st := newStream()
	st.debug = true
	return serveStream(d.s, ss, st, nil, false, func(bs *boundStream[discovery.DiscoveryRequest, discovery.DiscoveryResponse]) error {
		return sotw.serve(d.s.xds, bs)
	})
}

// boundStream hands go-control-plane a stream whose context carries the
// server's stream, whose requests all carry the first request's node (or
// none), and whose Recv ends when the server closes the stream.
type boundStream[Req, Resp any] struct {
	grpc.BidiStreamingServer[Req, Resp]
	ctx   context.Context
	first *Req
	in    chan *Req
	st    *stream
	kill  <-chan struct{}
	guard *nodeGuard
	err   error // why in was closed; written before close(in)
	// direct: Recv reads the client itself (no pump, in unused).
	direct bool
}

func newBoundStream[Req, Resp any](ss grpc.BidiStreamingServer[Req, Resp], ctx context.Context, first *Req, st *stream, direct bool) *boundStream[Req, Resp] {
	var pinned any
	if first != nil {
		pinned = first
	}
	b := &boundStream[Req, Resp]{BidiStreamingServer: ss, ctx: ctx, first: first, st: st, kill: st.kill, guard: newNodeGuard(pinned), direct: direct}
	if !direct {
		b.in = make(chan *Req)
	}
	return b
}

// Context implements grpc.ServerStream.
func (b *boundStream[Req, Resp]) Context() context.Context { return b.ctx }

// Recv returns the first request (already read), then what the client sends,
// until the client or the server ends the stream. Only the handler's single
// receiving goroutine calls it (go-control-plane's, or the relay's).
func (b *boundStream[Req, Resp]) Recv() (*Req, error) {
	if f := b.first; f != nil {
		b.first = nil
		return f, nil
	}
	if b.direct {
		r, err := b.BidiStreamingServer.Recv()
		if err != nil {
			return nil, err
		}
		if refused := b.guard.check(r); refused != nil {
			b.st.close(refused.code, refused.reason, refused.msg)
			return nil, refused
		}
		return r, nil
	}
	select {
	case r, ok := <-b.in:
		if !ok {
			return nil, b.err
		}
		return r, nil
	case <-b.kill:
		return nil, errors.New("stream closed by the server")
	}
}

// pump reads the client's requests; it ends when the gRPC stream ends (the
// handler returned), the server closed the stream, or a request carries
// another node than the first (the stream is then closed PermissionDenied
// before anything else sees that request).
func (b *boundStream[Req, Resp]) pump() {
	defer close(b.in)
	for {
		r, err := b.BidiStreamingServer.Recv()
		if err != nil {
			b.err = err
			return
		}
		if refused := b.guard.check(r); refused != nil {
			b.st.close(refused.code, refused.reason, refused.msg)
			b.err = refused
			return
		}
		select {
		case b.in <- r:
		case <-b.kill:
			b.err = errors.New("stream closed by the server")
			return
		case <-b.ctx.Done():
			b.err = b.ctx.Err()
			return
		}
	}
}

// State counts what the server holds: open streams, bound workloads, nodes
// with a snapshot, and the snapshot cache's per-node status entries.
type State struct {
	Streams, Workloads, Nodes, CacheStatuses int
}

// State returns what the server holds now.
func (s *Server) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return State{Streams: len(s.streams), Workloads: len(s.byWorkload), Nodes: len(s.nodes), CacheStatuses: len(s.snapshots.GetStatusKeys())}
}
