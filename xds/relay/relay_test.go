package relay_test

import (
	"context"
	"errors"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/embark-mesh/embark/test/adsclient"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/xds/relay"
)

// These tests drive the relay's protocol mechanics (resynchronisation,
// nonces, stream lifetimes, leaks) against go-control-plane's xDS server as
// the upstream, which the tests can restart and inspect at will; the tests of
// package xds run the relay against the real istiod and pilot-agent.

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var nodeID = fixtures.NodeID("10.0.0.5", k8stypes.NamespacedName{Namespace: "demo", Name: "vm1"})

// upstream is an xDS server standing in for istiod: a go-control-plane
// snapshot cache that records what its streams carry.
type upstream struct {
	addr  string
	cache cache.SnapshotCache

	mu       sync.Mutex
	g        *grpc.Server
	open     int
	opened   int
	tokens   []string
	nodes    []*core.Node
	requests []*discovery.DiscoveryRequest
	deltas   []*discovery.DeltaDiscoveryRequest
	seen     map[int64]bool // streams whose first request was recorded
	// quiet counts streams but records nothing (the leak test).
	quiet bool
}

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{cache: cache.NewSnapshotCache(false, cache.IDHash{}, nil), seen: map[int64]bool{}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = lis.Addr().String()
	u.serve(t, lis)
	t.Cleanup(u.stop)
	return u
}

func (u *upstream) serve(t *testing.T, lis net.Listener) {
	t.Helper()
	opened := func(ctx context.Context, _ int64, _ string) error {
		md, _ := metadata.FromIncomingContext(ctx)
		u.mu.Lock()
		defer u.mu.Unlock()
		u.open++
		u.opened++
		if u.quiet {
			return nil
		}
		u.tokens = append(u.tokens, strings.Join(md.Get("authorization"), ","))
		return nil
	}
	closed := func(int64, *core.Node) {
		u.mu.Lock()
		defer u.mu.Unlock()
		u.open--
	}
	srv := serverv3.NewServer(context.Background(), u.cache, serverv3.CallbackFuncs{
		StreamOpenFunc: opened, DeltaStreamOpenFunc: opened,
		StreamClosedFunc: closed, DeltaStreamClosedFunc: closed,
		StreamRequestFunc: func(id int64, r *discovery.DiscoveryRequest) error {
			u.mu.Lock()
			defer u.mu.Unlock()
			if u.quiet {
				return nil
			}
			// go-control-plane repeats the stream's node on every request.
			if !u.seen[id] {
				u.seen[id] = true
				u.nodes = append(u.nodes, r.GetNode())
			}
			u.requests = append(u.requests, r)
			return nil
		},
		StreamDeltaRequestFunc: func(id int64, r *discovery.DeltaDiscoveryRequest) error {
			u.mu.Lock()
			defer u.mu.Unlock()
			if u.quiet {
				return nil
			}
			if !u.seen[id] {
				u.seen[id] = true
				u.nodes = append(u.nodes, r.GetNode())
			}
			// A copy: go-control-plane sets the stream's node on the request
			// after this callback, while the test may be reading it.
			u.deltas = append(u.deltas, proto.CloneOf(r))
			return nil
		},
	})
	g := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(g, srv)
	u.mu.Lock()
	u.g = g
	u.seen = map[int64]bool{} // a new server numbers its streams from 1 again
	u.mu.Unlock()
	go func() { _ = g.Serve(lis) }()
}

// stop stops the server (every stream fails), as an istiod restart does.
func (u *upstream) stop() {
	u.mu.Lock()
	g := u.g
	u.g = nil
	u.mu.Unlock()
	if g != nil {
		g.Stop()
	}
}

// restart serves again on the same address.
func (u *upstream) restart(t *testing.T) {
	t.Helper()
	lis, err := net.Listen("tcp", u.addr)
	if err != nil {
		t.Fatal(err)
	}
	u.serve(t, lis)
}

func (u *upstream) publish(t *testing.T, version string, connectTimeout time.Duration) {
	t.Helper()
	c := &cluster.Cluster{Name: "outbound|9080||reviews.demo.svc.cluster.local", ConnectTimeout: durationpb.New(connectTimeout)}
	snap, err := cache.NewSnapshot(version, map[resource.Type][]types.Resource{resource.ClusterType: {c}})
	if err != nil {
		t.Fatal(err)
	}
	if err := u.cache.SetSnapshot(t.Context(), nodeID, snap); err != nil {
		t.Fatal(err)
	}
}

func (u *upstream) openStreams() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.open
}

func (u *upstream) snapshot() (opened int, tokens []string, nodes []*core.Node, reqs []*discovery.DiscoveryRequest, deltas []*discovery.DeltaDiscoveryRequest) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.opened, slices.Clone(u.tokens), slices.Clone(u.nodes), slices.Clone(u.requests), slices.Clone(u.deltas)
}

// frontend serves the relay to sidecars, as Embark's xDS server does (with
// no authentication: the token is taken as given).
type frontend struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	relay *relay.Relay
	addr  string
	// node is the SotW streams' Hooks.Node. Default: none.
	node func(*core.Node) (*core.Node, error)
	// health records the HealthInformation requests the hook kept.
	mu     sync.Mutex
	health int
}

func (f *frontend) authorization(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	return strings.Join(md.Get("authorization"), "")
}

func (f *frontend) StreamAggregatedResources(ss discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return f.relay.SotW(ss.Context(), ss, f.authorization(ss.Context()), relay.Hooks[discovery.DiscoveryRequest, discovery.DiscoveryResponse]{
		Request: func(r *discovery.DiscoveryRequest) (bool, error) {
			if r.GetTypeUrl() == "type.googleapis.com/istio.v1.HealthInformation" {
				f.mu.Lock()
				f.health++
				f.mu.Unlock()
				return false, nil
			}
			return true, nil
		},
		Node: f.node,
	})
}

func (f *frontend) DeltaAggregatedResources(ss discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	return f.relay.Delta(ss.Context(), ss, f.authorization(ss.Context()), relay.Hooks[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse]{})
}

// startFrontend runs a relay to u behind a gRPC server.
func startFrontend(t *testing.T, u *upstream) *frontend {
	t.Helper()
	return startFrontendWith(t, u, relay.Options{})
}

// startFrontendWith runs a relay to u with opts (Conn and backoffs set
// here).
func startFrontendWith(t *testing.T, u *upstream, opts relay.Options) *frontend {
	t.Helper()
	conn, err := grpc.NewClient(u.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 200 * time.Millisecond}, MinConnectTimeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	opts.Conn, opts.MinBackoff, opts.MaxBackoff = conn, 10*time.Millisecond, 100*time.Millisecond
	r, err := relay.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	f := &frontend{relay: r}
	g := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(g, f)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = lis.Addr().String()
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); _ = conn.Close() })
	return f
}

func sidecarNode() *core.Node {
	return &core.Node{Id: nodeID, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"ISTIO_VERSION":       structpb.NewStringValue("1.30.0"),
		"AUTO_REGISTER_GROUP": structpb.NewStringValue("ratings"),
		"WORKLOAD_ENTRY":      structpb.NewStringValue("vm1"),
	}}}
}

func dialFrontend(t *testing.T, f *frontend) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func recvSotW(t *testing.T, s discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient) *discovery.DiscoveryResponse {
	t.Helper()
	resp, err := s.Recv()
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	return resp
}

func connectTimeout(t *testing.T, resp *discovery.DiscoveryResponse) time.Duration {
	t.Helper()
	if len(resp.GetResources()) != 1 {
		t.Fatalf("want one cluster, got %d", len(resp.GetResources()))
	}
	c := &cluster.Cluster{}
	if err := resp.GetResources()[0].UnmarshalTo(c); err != nil {
		t.Fatal(err)
	}
	return c.GetConnectTimeout().AsDuration()
}

// TestSotWRelaysAndResynchronises relays a SotW stream with the sidecar's
// token and a node istiod will not auto-register, keeps health reports, and
// across an upstream restart keeps the sidecar's stream and resends its
// subscription with the version it accepted, so the new upstream answers on
// the same sidecar stream.
func TestSotWRelaysAndResynchronises(t *testing.T) {
	u := startUpstream(t)
	u.publish(t, "v1", time.Second)
	f := startFrontend(t, u)
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer sidecar-token"))
	defer cancel()
	s, err := discovery.NewAggregatedDiscoveryServiceClient(dialFrontend(t, f)).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DiscoveryRequest{Node: sidecarNode(), TypeUrl: "type.googleapis.com/istio.v1.HealthInformation"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	first := recvSotW(t, s)
	if got := connectTimeout(t, first); got != time.Second || first.GetVersionInfo() != "v1" {
		t.Fatalf("first response: version %q timeout %v, want v1 1s", first.GetVersionInfo(), got)
	}
	if !strings.HasPrefix(first.GetNonce(), "1:") {
		t.Errorf("nonce %q does not carry the upstream generation 1", first.GetNonce())
	}
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: first.GetVersionInfo(), ResponseNonce: first.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	fixtures.Eventually(t, 30*time.Second, "the ACK upstream", func() bool {
		_, _, _, reqs, _ := u.snapshot()
		return len(reqs) == 2
	})
	opened, tokens, nodes, reqs, _ := u.snapshot()
	if opened != 1 || !slices.Equal(tokens, []string{"Bearer sidecar-token"}) {
		t.Errorf("upstream streams %d with tokens %q, want 1 with the sidecar's", opened, tokens)
	}
	if len(nodes) != 1 || nodes[0].GetId() != nodeID {
		t.Fatalf("upstream nodes %v, want one %s", nodes, nodeID)
	}
	for _, k := range []string{"AUTO_REGISTER_GROUP", "WORKLOAD_ENTRY"} {
		if _, ok := nodes[0].GetMetadata().GetFields()[k]; ok {
			t.Errorf("node metadata %s relayed to istiod: it would auto-register the workload", k)
		}
	}
	if _, ok := nodes[0].GetMetadata().GetFields()["ISTIO_VERSION"]; !ok {
		t.Error("node metadata ISTIO_VERSION not relayed")
	}
	if ack := reqs[1]; ack.GetResponseNonce() != strings.TrimPrefix(first.GetNonce(), "1:") || ack.GetVersionInfo() != "v1" {
		t.Errorf("ACK upstream: nonce %q version %q, want the upstream's nonce and v1", ack.GetResponseNonce(), ack.GetVersionInfo())
	}
	f.mu.Lock()
	health := f.health
	f.mu.Unlock()
	if health != 1 {
		t.Errorf("health reports kept: %d, want 1", health)
	}

	// istiod goes away: the sidecar's stream stays open.
	u.stop()
	u.publish(t, "v2", 2*time.Second)
	u.restart(t)
	second := recvSotW(t, s)
	if got := connectTimeout(t, second); got != 2*time.Second || second.GetVersionInfo() != "v2" {
		t.Fatalf("after the restart: version %q timeout %v, want v2 2s", second.GetVersionInfo(), got)
	}
	if strings.HasPrefix(second.GetNonce(), "1:") {
		t.Errorf("nonce %q is of the first upstream stream", second.GetNonce())
	}
	opened, _, nodes, reqs, _ = u.snapshot()
	if opened != 2 || len(nodes) != 2 || nodes[1].GetId() != nodeID {
		t.Fatalf("after the restart: %d streams, nodes %v; want a second stream with the node", opened, nodes)
	}
	resync := reqs[2]
	if resync.GetTypeUrl() != resource.ClusterType || resync.GetVersionInfo() != "v1" || resync.GetResponseNonce() != "" {
		t.Errorf("resync request %v, want CDS with the accepted version v1 and no nonce", resync)
	}
	// A late ACK of the first stream's response is not relayed; the ACK of
	// the new one is.
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: "v1", ResponseNonce: first.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: "v2", ResponseNonce: second.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	fixtures.Eventually(t, 30*time.Second, "the second ACK upstream", func() bool {
		_, _, _, reqs, _ = u.snapshot()
		return len(reqs) >= 4
	})
	if ack := reqs[3]; len(reqs) != 4 || ack.GetVersionInfo() != "v2" || ack.GetResponseNonce() != strings.SplitN(second.GetNonce(), ":", 2)[1] {
		t.Errorf("requests after the restart %v, want only the ACK of v2", reqs[2:])
	}

	// The sidecar closes its stream: so does the relay upstream.
	cancel()
	fixtures.Eventually(t, 30*time.Second, "the upstream stream to close", func() bool { return u.openStreams() == 0 })
}

// TestDeltaResynchronises resends the Delta subscription with the ACKed
// resource versions after an upstream restart.
func TestDeltaResynchronises(t *testing.T) {
	u := startUpstream(t)
	u.publish(t, "v1", time.Second)
	f := startFrontend(t, u)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer sidecar-token")
	s, err := discovery.NewAggregatedDiscoveryServiceClient(dialFrontend(t, f)).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DeltaDiscoveryRequest{Node: sidecarNode(), TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	first, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(first.GetResources()) != 1 {
		t.Fatalf("first delta response %v, want one cluster", first)
	}
	name, version := first.GetResources()[0].GetName(), first.GetResources()[0].GetVersion()
	if err := s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: first.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	fixtures.Eventually(t, 30*time.Second, "the ACK upstream", func() bool {
		_, _, _, _, deltas := u.snapshot()
		return len(deltas) == 2
	})
	u.stop()
	u.publish(t, "v2", 2*time.Second)
	u.restart(t)
	second, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(second.GetResources()) != 1 || second.GetResources()[0].GetVersion() == version {
		t.Fatalf("after the restart: %v, want the changed cluster", second)
	}
	_, _, nodes, _, deltas := u.snapshot()
	if len(nodes) != 2 || len(deltas) < 3 {
		t.Fatalf("after the restart: nodes %d, requests %d", len(nodes), len(deltas))
	}
	if got := deltas[2].GetInitialResourceVersions(); len(got) != 1 || got[name] != version {
		t.Errorf("resync initial_resource_versions %v, want %s=%s", got, name, version)
	}
}

// TestNoLeakAcrossStreams opens and closes 1,000 relayed streams: each
// closes its upstream stream, and the process's goroutines and live heap
// come back to where they were.
func TestNoLeakAcrossStreams(t *testing.T) {
	u := startUpstream(t)
	u.mu.Lock()
	u.quiet = true
	u.mu.Unlock()
	u.publish(t, "v1", time.Second)
	f := startFrontend(t, u)
	conn := dialFrontend(t, f)
	cycle := func() error {
		s, err := adsclient.OpenSotW(t.Context(), conn, "t", sidecarNode())
		if err != nil {
			return err
		}
		defer s.Close()
		if err := s.Request(resource.ClusterType); err != nil {
			return err
		}
		resp, err := s.Recv(0)
		if err != nil {
			return err
		}
		if len(resp.GetResources()) != 1 {
			return errors.New("no cluster")
		}
		return nil
	}
	settle := func() (goroutines int, heap uint64) {
		fixtures.Eventually(t, 30*time.Second, "upstream streams to close", func() bool { return u.openStreams() == 0 })
		var ms runtime.MemStats
		// Streams end asynchronously after the client cancels: wait until
		// the goroutine count stops falling.
		last := -1
		for range 100 {
			runtime.GC()
			n := runtime.NumGoroutine()
			if n == last {
				break
			}
			last = n
			time.Sleep(50 * time.Millisecond)
		}
		runtime.ReadMemStats(&ms)
		return last, ms.HeapAlloc
	}
	for range 300 { // warm up pools, connections and caches
		if err := cycle(); err != nil {
			t.Fatal(err)
		}
	}
	g0, h0 := settle()
	for i := range 1000 {
		if err := cycle(); err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
	}
	g1, h1 := settle()
	t.Logf("goroutines %d -> %d, heap %d -> %d KiB", g0, g1, h0>>10, h1>>10)
	if g1 > g0 {
		t.Errorf("goroutines grew from %d to %d across 1,000 streams", g0, g1)
	}
	// A relayed stream holds a few KiB while open: 1,000 leaked streams
	// would add megabytes; allow 256 KiB of noise.
	if h1 > h0+256<<10 {
		t.Errorf("live heap grew by %d KiB across 1,000 streams", (h1-h0)>>10)
	}
}

// TestNodeHookReplacesTheSidecarsNode: with Hooks.Node, istiod gets the
// node the hook returns (never the two auto-registration keys, even from
// the hook), on the first upstream stream and on the one that replaces it;
// the hook runs once per sidecar stream. A hook's error ends the sidecar's
// stream with it before anything is relayed.
func TestNodeHookReplacesTheSidecarsNode(t *testing.T) {
	u := startUpstream(t)
	u.publish(t, "v1", time.Second)
	f := startFrontend(t, u)
	var calls atomic.Int32
	f.node = func(n *core.Node) (*core.Node, error) {
		calls.Add(1)
		if n.GetMetadata().GetFields()["REFUSE"] != nil {
			return nil, status.Error(codes.InvalidArgument, "refused by the hook")
		}
		return &core.Node{Id: n.GetId(), Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			"LABELS":              structpb.NewStringValue("built"),
			"AUTO_REGISTER_GROUP": structpb.NewStringValue("ratings"),
		}}}, nil
	}
	conn := dialFrontend(t, f)
	open := func(node *core.Node) discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient {
		t.Helper()
		s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := open(sidecarNode())
	recvSotW(t, s)
	u.stop()
	u.publish(t, "v2", 2*time.Second)
	u.restart(t)
	recvSotW(t, s)
	_, _, nodes, _, _ := u.snapshot()
	if len(nodes) != 2 {
		t.Fatalf("%d upstream streams recorded, want 2", len(nodes))
	}
	for i, n := range nodes {
		md := n.GetMetadata().GetFields()
		if n.GetId() != nodeID || md["LABELS"].GetStringValue() != "built" || md["ISTIO_VERSION"] != nil || md["AUTO_REGISTER_GROUP"] != nil {
			t.Errorf("upstream stream %d got node %v, want the hook's without AUTO_REGISTER_GROUP", i+1, n)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the hook ran %d times for one sidecar stream, want 1", n)
	}

	refused := sidecarNode()
	refused.Metadata.Fields["REFUSE"] = structpb.NewBoolValue(true)
	if _, err := open(refused).Recv(); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "refused by the hook") {
		t.Fatalf("a node the hook refuses: %v, want its InvalidArgument", err)
	}
	if opened, _, _, _, _ := u.snapshot(); opened != 2 {
		t.Errorf("%d upstream streams opened, want none for the refused node", opened-2)
	}
}
