package adversarial

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/limits"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/nodeid"
	"github.com/embark-mesh/embark/registry/presence"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/xds"
	"github.com/embark-mesh/embark/xds/relay"
)

// xdsPlane is the real xDS server, with the endpoint's limits, on loopback.
type xdsPlane struct {
	addr    string
	server  *xds.Server
	limiter *limits.Limiter
	cache   cache.Cache
}

// startXDS starts the xDS server as the endpoint wires it: the same limits
// (tightened by tweak), its listener wrapped by the limiter.
func startXDS(t *testing.T, opts limits.Options) *xdsPlane {
	t.Helper()
	return startXDSWith(t, opts, nil)
}

// startXDSWith starts the xDS server as startXDS does, in istiod mode when
// r is not nil.
func startXDSWith(t *testing.T, opts limits.Options, r *relay.Relay) *xdsPlane {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c, err := env.StartCache(ctx, func(c cache.Cache) error { return registry.SetupIndexes(ctx, c) },
		&runtimev1alpha1.WorkloadAutoRegistrationList{}, &corev1.SecretList{}, &istionetworkingv1.WorkloadEntryList{})
	if err != nil {
		t.Fatal(err)
	}
	conns, err := presence.NewConnections(ctx, presence.ConnectionOptions{Client: env.Client, Replica: "adversarial", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	lim, err := limits.New("xds", opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := xds.NewServer(ctx, xds.Options{
		Connections: conns, TokenReviews: cs.AuthenticationV1().TokenReviews(),
		Reader: c, APIReader: env.Client, Informers: c, Logger: slog.New(slog.DiscardHandler),
		FirstRequestTimeout: lim.Options().FirstRequestTimeout.Duration, Relay: r,
	})
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(lim.GRPCServerOptions()...)
	srv.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = g.Serve(lim.Listen(lis)) }()
	go func() { defer wg.Done(); _ = srv.Run(ctx) }()
	t.Cleanup(func() {
		g.Stop()
		cancel()
		wg.Wait()
		conns.Wait()
	})
	return &xdsPlane{addr: lis.Addr().String(), server: srv, limiter: lim, cache: c}
}

// sidecar is a registered workload's sidecar credential and node ID.
type sidecar struct {
	key     types.NamespacedName
	token   string
	expires time.Time // the token's
	nodeID  string
}

// registerWorkload registers an EC2 workload of group in ns, as the
// endpoint does after verifying it.
func registerWorkload(t *testing.T, p *xdsPlane, ns, group, instance, ip string) *sidecar {
	t.Helper()
	ctx := t.Context()
	wg := &istionetworkingv1.WorkloadGroup{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: group}, wg); err != nil {
		wg = fixtures.WorkloadGroup(ns, nil)
		wg.Name = group
		fixtures.CreateGroup(ctx, t, env.Client, wg)
	}
	reg, err := registry.NewRegistrar(registry.Options{Client: env.Client, Cache: p.cache, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := reg.Write(ctx, registry.Request{Group: wg, Identity: fixtures.AWSIdentity(instance), Registration: fixtures.Registration(ip)})
	if err != nil {
		t.Fatalf("register %s/%s: %v", ns, group, err)
	}
	key := client.ObjectKeyFromObject(res.Registration)
	return &sidecar{key: key, token: res.SidecarToken.Token, expires: res.SidecarToken.ExpiresAt, nodeID: fixtures.NodeID(ip, key)}
}

func nodeOf(id string) *core.Node {
	return &core.Node{Id: id, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"PROXY_CONFIG": structpb.NewStructValue(&structpb.Struct{}), "ISTIO_VERSION": structpb.NewStringValue("1.30.0"),
	}}}
}

// dialFrom connects to addr from the loopback address src.
func dialFrom(t *testing.T, src, addr string) *grpc.ClientConn {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// openADS opens a SotW stream as token with node and waits for the first
// listener response.
func openADS(ctx context.Context, conn *grpc.ClientConn, token string, node *core.Node) (discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	_ = s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ListenerType})
	if _, err := s.Recv(); err != nil {
		return nil, err
	}
	return s, nil
}

func recvErr(s discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient) error {
	for {
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("%s: never held", what)
	}
}

func TestNodeSwitchToAnotherWorkload(t *testing.T) {
	Attack(t, "xDS: a stream authorized as workload A asks with workload B's node ID")
	p := startXDS(t, limits.Options{})
	ns := env.Namespace(t)
	a := registerWorkload(t, p, ns, "ratings", "i-000000000000000a1", "10.1.0.1")
	b := registerWorkload(t, p, ns, "ratings", "i-000000000000000b1", "10.1.0.2")
	conn := dialFrom(t, "127.0.0.1", p.addr)
	if _, err := openADS(t.Context(), conn, b.token, nodeOf(b.nodeID)); err != nil {
		t.Fatal(err)
	}
	s, err := openADS(t.Context(), conn, a.token, nodeOf(a.nodeID))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DiscoveryRequest{Node: nodeOf(b.nodeID), TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	if err := recvErr(s); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("A asking as B: %v, want PermissionDenied", err)
	}
}

func TestInventedNodeIDsLeaveNoState(t *testing.T) {
	Attack(t, "xDS: invented node IDs on an authorized stream leave state behind (unbounded memory)")
	p := startXDS(t, limits.Options{})
	ns := env.Namespace(t)
	a := registerWorkload(t, p, ns, "ratings", "i-000000000000000a2", "10.1.0.3")
	conn := dialFrom(t, "127.0.0.1", p.addr)
	before := p.server.State()
	for i := range 50 {
		s, err := openADS(t.Context(), conn, a.token, nodeOf(a.nodeID))
		if err != nil {
			t.Fatal(err)
		}
		invented := nodeid.Build("10.1.0.3", types.NamespacedName{Namespace: ns, Name: fmt.Sprintf("invented-%d", i)})
		if err := s.Send(&discovery.DiscoveryRequest{Node: nodeOf(invented), TypeUrl: resource.ListenerType}); err != nil {
			t.Fatal(err)
		}
		if err := recvErr(s); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("invented node %d: %v, want PermissionDenied", i, err)
		}
	}
	waitUntil(t, "the server holds what it held before", func() bool { return p.server.State() == before })
}

func TestJunkBearerStreamFlood(t *testing.T) {
	Attack(t, "xDS: 5,000 `Bearer junk` streams on one connection that never send a request")
	p := startXDS(t, limits.Options{FirstRequestTimeout: &metav1.Duration{Duration: 300 * time.Millisecond}, RequestsPerSecondPerSource: 1e6, RequestBurstPerSource: 1e6})
	conn := dialFrom(t, "127.0.0.2", p.addr)
	runtime.GC()
	before := runtime.NumGoroutine()
	// The client never gives up by itself (a deadline of its own would
	// look like the server's); the test ends the flood after 3 minutes.
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer junk"))
	defer cancel()
	stop := time.AfterFunc(3*time.Minute, cancel)
	defer stop.Stop()
	const n = 5000
	outcomes := make(chan string, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
			if err == nil {
				_, err = s.Recv()
			}
			outcome := status.Code(err).String()
			if strings.Contains(status.Convert(err).Message(), "no request within") {
				outcome = "cut off by the server"
			}
			outcomes <- outcome
		}()
	}
	wg.Wait()
	close(outcomes)
	got := map[string]int{}
	for o := range outcomes {
		got[o]++
	}
	if got["cut off by the server"] != n {
		t.Errorf("stream outcomes %v, want all %d cut off DeadlineExceeded by the server", got, n)
	}
	// Everything the flood started has ended (client and server run here).
	waitUntil(t, "goroutines back to their number before the flood", func() bool { return runtime.NumGoroutine() <= before+20 })
}

func TestFloodFromOneSourceStarvesAnother(t *testing.T) {
	Attack(t, "xDS: a flood of streams and connections from 127.0.0.2 keeps a sidecar on 127.0.0.1 out")
	p := startXDS(t, limits.Options{RequestsPerSecondPerSource: 2, RequestBurstPerSource: 10, MaxConnectionsPerSource: 4})
	ns := env.Namespace(t)
	a := registerWorkload(t, p, ns, "ratings", "i-000000000000000a3", "10.1.0.4")
	flood := dialFrom(t, "127.0.0.2", p.addr)
	refused := 0
	for range 200 {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		_, err := openADS(ctx, flood, "junk", nodeOf(a.nodeID))
		cancel()
		if status.Code(err) == codes.ResourceExhausted {
			refused++
		}
	}
	for range 20 {
		c := dialFrom(t, "127.0.0.2", p.addr)
		c.Connect()
	}
	if refused < 150 {
		t.Errorf("%d of 200 flood streams refused ResourceExhausted, want at least 150", refused)
	}
	waitUntil(t, "connections over the per-source cap refused", func() bool { return p.limiter.Refused(limits.LimitSourceConnections) > 0 })
	legit := dialFrom(t, "127.0.0.1", p.addr)
	if _, err := openADS(t.Context(), legit, a.token, nodeOf(a.nodeID)); err != nil {
		t.Fatalf("the legitimate sidecar on 127.0.0.1: %v", err)
	}
}

func TestDottedNamesConnect(t *testing.T) {
	Attack(t, "names: a WorkloadGroup name with a dot (ratings.v1) registers but its sidecar is refused")
	p := startXDS(t, limits.Options{})
	ns := env.Namespace(t)
	w := registerWorkload(t, p, ns, "ratings.v1", "i-000000000000000d1", "10.1.0.5")
	if !strings.HasPrefix(w.key.Name, "ratings.v1-") {
		t.Fatalf("registration name %q", w.key.Name)
	}
	if _, err := openADS(t.Context(), dialFrom(t, "127.0.0.1", p.addr), w.token, nodeOf(w.nodeID)); err != nil {
		t.Fatalf("sidecar of %s: %v", w.key, err)
	}
}

func TestInventedTypeURLs(t *testing.T) {
	Attack(t, "xDS: an authorized stream subscribes to thousands of invented type URLs (memory per stream unbounded)")
	p := startXDS(t, limits.Options{})
	ns := env.Namespace(t)
	a := registerWorkload(t, p, ns, "ratings", "i-000000000000000a4", "10.1.0.6")
	conn := dialFrom(t, "127.0.0.1", p.addr)

	// Every type a sidecar (Envoy and Istio's agent) asks istiod for keeps
	// the stream open.
	s, err := openADS(t.Context(), conn, a.token, nodeOf(a.nodeID))
	if err != nil {
		t.Fatal(err)
	}
	for _, typeURL := range []string{
		resource.EndpointType, resource.RouteType, resource.SecretType, resource.ExtensionConfigType,
		"type.googleapis.com/istio.networking.nds.v1.NameTable", "type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig",
		xds.TypeHealthInformation, resource.ClusterType,
	} {
		if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: typeURL}); err != nil {
			t.Fatal(err)
		}
	}
	// Requests are handled in order: the clusters come only if no type
	// before them ended the stream.
	for {
		resp, err := s.Recv()
		if err != nil {
			t.Fatalf("a sidecar's own types ended the stream: %v", err)
		}
		if resp.GetTypeUrl() == resource.ClusterType {
			break
		}
	}

	// Invented types end the stream at the first one, before anything is
	// kept for it.
	s, err = openADS(t.Context(), conn, a.token, nodeOf(a.nodeID))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5000 {
		if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: fmt.Sprintf("type.googleapis.com/invented.v1.Type%d", i)}); err != nil {
			break // the server ended the stream: Recv has its status
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- recvErr(s) }()
	select {
	case err = <-errc:
	case <-ctx.Done():
		t.Fatal("5,000 invented type URLs: the stream is still open")
	}
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "type.googleapis.com/invented.v1.Type0") {
		t.Fatalf("invented type URLs: %v, want InvalidArgument naming the first one", err)
	}
}
