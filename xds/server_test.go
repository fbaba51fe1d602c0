package xds

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/boundtoken"
	"github.com/embark-mesh/embark/registry/presence"
	"github.com/embark-mesh/embark/test/adsclient"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/testenv"
	"github.com/embark-mesh/embark/xds/tokenauth"
)

var (
	env       *testenv.Env
	informers cache.Cache
	clientset *kubernetes.Clientset
)

// TestMain fails the package when a goroutine outlives the tests (and every
// stream they opened).
func TestMain(m *testing.M) {
	os.Exit(testenv.CheckLeaks(runStoppingIstiod(m, func(ctx context.Context) error {
		var err error
		informers, err = cache.New(env.Config, cache.Options{
			Scheme: env.Scheme,
			ByObject: map[client.Object]cache.ByObject{
				&corev1.Secret{}: {Label: labels.SelectorFromSet(labels.Set{registry.LabelSidecarCredential: "true"})},
			},
		})
		if err != nil {
			return err
		}
		if err := registry.SetupIndexes(ctx, informers); err != nil {
			return err
		}
		go func() { _ = informers.Start(ctx) }()
		if !informers.WaitForCacheSync(ctx) {
			return errors.New("cache did not sync")
		}
		for _, l := range []client.ObjectList{&istionetworkingv1.WorkloadEntryList{}, &runtimev1alpha1.WorkloadAutoRegistrationList{}, &corev1.SecretList{}} {
			if err := informers.List(ctx, l); err != nil {
				return err
			}
		}
		clientset, err = kubernetes.NewForConfig(env.Config)
		return err
	})))
}

// runStoppingIstiod runs the tests with the control plane and setup, then
// stops the shared istiod (certs_test.go), if a test started it.
func runStoppingIstiod(m *testing.M, setup func(ctx context.Context) error) int {
	defer stopSharedIstiod()
	return testenv.Run(m, testenv.Options{GarbageCollector: true}, &env, setup)
}

// recordingHealth records health reports.
type recordingHealth struct {
	mu      sync.Mutex
	reports []Health
	of      []types.NamespacedName // the workload of each report
}

func (r *recordingHealth) ReportHealth(_ context.Context, w registry.StreamWorkload, h Health) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reports = append(r.reports, h)
	r.of = append(r.of, w.Key)
}

// workloads returns the workload of each report, in order.
func (r *recordingHealth) workloads() []types.NamespacedName {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.of)
}

func (r *recordingHealth) all() []Health {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Health(nil), r.reports...)
}

// replica is one endpoint replica's xDS server, served on loopback.
type replica struct {
	name      string
	server    *Server
	conns     *presence.Connections
	health    *recordingHealth
	addr      string
	debugAddr string
	metrics   *Metrics
	stop      func()
}

// startReplica starts a replica whose connection tracker runs on clock (nil:
// time.Now); tweaks adjust the server's options.
func startReplica(t *testing.T, name string, clock func() time.Time, tweaks ...func(*Options)) *replica {
	t.Helper()
	return startReplicaWith(t, name, clock, nil, tweaks...)
}

// startReplicaWith starts a replica whose health reports go to the sink sink
// makes (nil: recorded in replica.health).
func startReplicaWith(t *testing.T, name string, clock func() time.Time, sink func(context.Context, *presence.Connections) (HealthSink, func()), tweaks ...func(*Options)) *replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log := fixtures.Logger(t)
	conns, err := presence.NewConnections(ctx, presence.ConnectionOptions{Client: env.Client, Replica: name, Logger: log, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	health := &recordingHealth{}
	var hs HealthSink = health
	stopSink := func() {}
	if sink != nil {
		hs, stopSink = sink(ctx, conns)
	}
	metrics, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{
		Connections: conns, TokenReviews: clientset.AuthenticationV1().TokenReviews(),
		Reader: informers, APIReader: env.Client, Informers: informers,
		Health: hs, Logger: log, Metrics: metrics,
	}
	for _, tweak := range tweaks {
		tweak(&opts)
	}
	srv, err := NewServer(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	g, dg := grpc.NewServer(), grpc.NewServer()
	srv.Register(g)
	srv.RegisterDebug(dg)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); _ = g.Serve(lis) }()
	go func() { defer wg.Done(); _ = dg.Serve(dlis) }()
	go func() { defer wg.Done(); _ = srv.Run(ctx) }()
	r := &replica{name: name, server: srv, conns: conns, health: health, metrics: metrics, addr: lis.Addr().String(), debugAddr: dlis.Addr().String()}
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			g.Stop()
			dg.Stop()
			flush, done := context.WithTimeout(context.Background(), 10*time.Second)
			defer done()
			_ = conns.Flush(flush)
			cancel()
			wg.Wait()
			conns.Wait()
			stopSink()
		})
	}
	t.Cleanup(r.stop)
	return r
}

// workload is a registered workload.
type workload struct {
	key    types.NamespacedName
	ip     string
	token  string
	nodeID string
	res    *registry.Result
}

func register(t *testing.T, ns, instance, ip string) *workload {
	t.Helper()
	ctx := t.Context()
	wg := &istionetworkingv1.WorkloadGroup{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: fixtures.GroupName}, wg); err != nil {
		wg = fixtures.WorkloadGroup(ns, nil)
		wg.Spec.Template.Network = "vms"
		fixtures.CreateGroup(ctx, t, env.Client, wg)
	}
	reg, err := registry.NewRegistrar(registry.Options{Client: env.Client, Cache: informers, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := reg.Write(ctx, registry.Request{Group: wg, Identity: fixtures.AWSIdentity(instance), Registration: fixtures.Registration(ip)})
	if err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(res.Registration)
	return &workload{key: key, ip: ip, token: res.SidecarToken.Token, res: res, nodeID: fixtures.NodeID(ip, key)}
}

func sidecarNode(id string) *core.Node {
	return &core.Node{Id: id, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"PROXY_CONFIG":  structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"discoveryAddress": structpb.NewStringValue("embark:15012")}}),
		"ISTIO_VERSION": structpb.NewStringValue("1.30.0"),
		"CLUSTER_ID":    structpb.NewStringValue("vm-cluster"),
	}}}
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// adsClient is a SotW or Delta ADS client speaking like Istio's agent.
type adsClient struct {
	sotw  *adsclient.SotW
	delta *adsclient.Delta
}

// open opens a stream, subscribes to listeners and waits for the first
// response (or the refusal).
func open(t *testing.T, conn *grpc.ClientConn, delta bool, token string, node *core.Node) (*adsClient, error) {
	t.Helper()
	if delta {
		d, err := adsclient.OpenDelta(t.Context(), conn, token, node)
		if err != nil {
			return nil, err
		}
		t.Cleanup(d.Close)
		// A stream the server refused at once fails Send with io.EOF; Recv
		// has the status.
		_ = d.Subscribe(resource.ListenerType)
		resp, err := d.Recv(0)
		if err != nil {
			return nil, err
		}
		return &adsClient{delta: d}, d.ACK(resp)
	}
	s, err := adsclient.OpenSotW(t.Context(), conn, token, node)
	if err != nil {
		return nil, err
	}
	t.Cleanup(s.Close)
	_ = s.Request(resource.ListenerType)
	resp, err := s.Recv(0)
	if err != nil {
		return nil, err
	}
	return &adsClient{sotw: s}, s.ACK(resp)
}

// cancel ends the stream.
func (c *adsClient) cancel() {
	if c.delta != nil {
		c.delta.Close()
		return
	}
	c.sotw.Close()
}

// recvErr waits for the stream to end and returns why.
func (c *adsClient) recvErr() error {
	if c.delta != nil {
		return c.delta.Wait()
	}
	return c.sotw.Wait()
}

type connState struct {
	status       metav1.ConditionStatus
	replica      string
	disconnected bool
	weController string
	weConnected  bool
	weDisconn    bool
}

func readState(t *testing.T, key types.NamespacedName) connState {
	t.Helper()
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), key, war); err != nil {
		t.Fatal(err)
	}
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(t.Context(), key, we); err != nil {
		t.Fatal(err)
	}
	var s connState
	if c := meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected); c != nil {
		s.status = c.Status
	}
	if c := war.Status.Connection; c != nil {
		s.replica, s.disconnected = c.Replica, c.DisconnectedAt != nil
	}
	s.weController = we.Annotations[registry.AnnotationConnectedReplica]
	s.weConnected = we.Annotations[registry.AnnotationConnectedAt] != ""
	s.weDisconn = we.Annotations[registry.AnnotationDisconnectedAt] != ""
	return s
}

func connected(r string) connState {
	return connState{status: metav1.ConditionTrue, replica: r, weController: r, weConnected: true}
}

// disconnected is a stored disconnect: the registration's status only (a
// disconnect writes no WorkloadEntry annotation).
func disconnected(r string) connState {
	return connState{status: metav1.ConditionFalse, replica: r, disconnected: true, weController: r, weConnected: true}
}

func waitState(t *testing.T, key types.NamespacedName, want connState) {
	t.Helper()
	var got connState
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		got = readState(t, key)
		return got == want, nil
	})
	if err != nil {
		t.Fatalf("%s: state %+v, want %+v", key, got, want)
	}
}

func TestStreamLivenessBecomesStatus(t *testing.T) {
	for _, tt := range []struct {
		name  string
		delta bool
	}{{"SotW", false}, {"Delta", true}} {
		t.Run(tt.name, func(t *testing.T) {
			r := startReplica(t, "replica-a", nil)
			w := register(t, env.Namespace(t), "i-0000000000000000a", "10.0.0.1")
			conn := dial(t, r.addr)

			first, err := open(t, conn, tt.delta, w.token, sidecarNode(w.nodeID))
			if err != nil {
				t.Fatal(err)
			}
			waitState(t, w.key, connected("replica-a"))

			// A second concurrent stream of the same workload counts once.
			second, err := open(t, conn, tt.delta, w.token, sidecarNode(w.nodeID))
			if err != nil {
				t.Fatal(err)
			}
			if n := r.conns.Streams(w.key); n != 2 {
				t.Errorf("streams = %d, want 2", n)
			}
			first.cancel()
			waitFor(t, func() bool { return r.conns.Streams(w.key) == 1 })
			if err := r.conns.Flush(t.Context()); err != nil {
				t.Fatal(err)
			}
			if got := readState(t, w.key); got != connected("replica-a") {
				t.Errorf("after one of two streams closed: %+v", got)
			}

			second.cancel()
			waitState(t, w.key, disconnected("replica-a"))

			// Reconnecting flips it back.
			if _, err := open(t, conn, tt.delta, w.token, sidecarNode(w.nodeID)); err != nil {
				t.Fatal(err)
			}
			waitState(t, w.key, connected("replica-a"))
		})
	}
}

// waitFor waits for a condition on the replica's own state.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	fixtures.Eventually(t, 20*time.Second, "condition", cond)
}

// requestToken asks the API server for a token of the workload's service
// account, optionally bound to the workload's Secret.
func requestToken(t *testing.T, w *workload, audience string, bound bool) string {
	t.Helper()
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: ptr.To(int64(600))}}
	if bound {
		secret := &corev1.Secret{}
		if err := env.Client.Get(t.Context(), types.NamespacedName{Namespace: w.key.Namespace, Name: registry.SidecarSecretName(w.key.Name)}, secret); err != nil {
			t.Fatal(err)
		}
		tr.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Secret", Name: secret.Name, UID: secret.UID}
	}
	out, err := clientset.CoreV1().ServiceAccounts(w.key.Namespace).CreateToken(t.Context(), fixtures.ServiceAccount, tr, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out.Status.Token
}

func TestRefusedStreamsChangeNothing(t *testing.T) {
	r := startReplica(t, "replica-a", nil)
	ns := env.Namespace(t)
	a := register(t, ns, "i-0000000000000000a", "10.0.1.1")
	b := register(t, ns, "i-0000000000000000b", "10.0.1.2")
	other := register(t, env.Namespace(t), "i-0000000000000000c", "10.0.1.3")
	conn := dial(t, r.addr)
	tests := []struct {
		name       string
		token      string
		node       string
		wantCode   codes.Code
		wantMsg    string
		wantReason string // metrics label
	}{
		{name: "no token", node: a.nodeID, wantCode: codes.Unauthenticated, wantMsg: "no sidecar token", wantReason: tokenauth.ReasonNoToken},
		{name: "garbage token", token: "not-a-token", node: a.nodeID, wantCode: codes.Unauthenticated, wantReason: tokenauth.ReasonInvalidToken},
		{name: "wrong audience", token: requestToken(t, a, "someone-else", true), node: a.nodeID, wantCode: codes.Unauthenticated, wantReason: tokenauth.ReasonInvalidToken},
		{name: "service-account token not bound to a Secret", token: requestToken(t, a, registry.DefaultXDSAudience, false), node: a.nodeID, wantCode: codes.Unauthenticated, wantMsg: "not bound", wantReason: tokenauth.ReasonUnboundToken},
		{name: "A's token with B's node ID", token: a.token, node: b.nodeID, wantCode: codes.PermissionDenied, wantMsg: b.key.Name, wantReason: reasonOtherWorkload},
		{name: "A's token with another namespace's node ID", token: a.token, node: other.nodeID, wantCode: codes.PermissionDenied, wantReason: reasonOtherWorkload},
		{name: "A's token with another address", token: a.token, node: strings.Replace(a.nodeID, a.ip, "10.9.9.9", 1), wantCode: codes.PermissionDenied, wantMsg: "10.9.9.9", wantReason: reasonAddress},
		{name: "not a sidecar node ID", token: a.token, node: "router~10.0.1.1~x.y~y.svc.cluster.local", wantCode: codes.PermissionDenied, wantReason: reasonBadNodeID},
	}
	wantRefused := map[[2]string]float64{}
	for _, tt := range tests {
		for _, delta := range []bool{false, true} {
			t.Run(tt.name, func(t *testing.T) {
				_, err := open(t, conn, delta, tt.token, sidecarNode(tt.node))
				if got := status.Code(err); got != tt.wantCode || !strings.Contains(status.Convert(err).Message(), tt.wantMsg) {
					t.Errorf("delta=%v: %v, want %v mentioning %q", delta, err, tt.wantCode, tt.wantMsg)
				}
			})
			wantRefused[[2]string{tt.wantCode.String(), tt.wantReason}]++
		}
	}
	for labels, want := range wantRefused {
		if got := testutil.ToFloat64(r.metrics.refused.WithLabelValues(labels[0], labels[1])); got != want {
			t.Errorf("embark_xds_refused_streams_total{code=%q,reason=%q} = %v, want %v", labels[0], labels[1], got, want)
		}
	}
	if got, want := testutil.CollectAndCount(r.metrics.refused), len(wantRefused); got != want {
		t.Errorf("refusals counted under %d label sets, want %d", got, want)
	}
	for _, w := range []*workload{a, b, other} {
		if got := readState(t, w.key); got != (connState{}) {
			t.Errorf("%s: refused streams changed its state: %+v", w.key.Name, got)
		}
	}
}

func TestDeletingTheRegistrationClosesItsStream(t *testing.T) {
	r := startReplica(t, "replica-a", nil)
	w := register(t, env.Namespace(t), "i-0000000000000000a", "10.0.2.1")
	c, err := open(t, dial(t, r.addr), false, w.token, sidecarNode(w.nodeID))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, w.key, connected("replica-a"))
	if err := env.Client.Delete(t.Context(), w.res.Registration); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.recvErr() }()
	select {
	case err := <-errc:
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "onboard again") {
			t.Errorf("stream ended with %v, want Unavailable telling it to onboard again", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the stream of a deleted registration stays open")
	}
	waitFor(t, func() bool { return r.conns.Streams(w.key) == 0 })
	// Deleting the registration deletes its credential Secret too, and the
	// stream is closed by whichever deletion the replica sees first (both
	// tell the agent to onboard again): one close, for one of the two.
	deleted := testutil.ToFloat64(r.metrics.closed.WithLabelValues(closeRegistrationDeleted))
	secretDeleted := testutil.ToFloat64(r.metrics.closed.WithLabelValues(closeCredentialDeleted))
	if deleted+secretDeleted != 1 {
		t.Errorf("embark_xds_streams_closed_by_server_total{reason=registration_deleted} = %v and {reason=credential_deleted} = %v, want one close between them", deleted, secretDeleted)
	}
	// Its token no longer opens a stream.
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: w.key.Namespace, Name: registry.SidecarSecretName(w.key.Name)}}
	waitFor(t, func() bool {
		return apierrors.IsNotFound(informers.Get(t.Context(), client.ObjectKeyFromObject(secret), &corev1.Secret{}))
	})
	_, err = open(t, dial(t, r.addr), false, w.token, sidecarNode(w.nodeID))
	if code := status.Code(err); code != codes.Unauthenticated && code != codes.PermissionDenied {
		t.Errorf("revoked token: %v, want Unauthenticated or PermissionDenied", err)
	}
}

func TestAStaleDisconnectDoesNotOverwriteANewerConnect(t *testing.T) {
	a := startReplica(t, "replica-a", nil)
	b := startReplica(t, "replica-b", func() time.Time { return time.Now().Add(2 * time.Second) })
	w := register(t, env.Namespace(t), "i-0000000000000000a", "10.0.3.1")
	onA, err := open(t, dial(t, a.addr), false, w.token, sidecarNode(w.nodeID))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, w.key, connected("replica-a"))
	// The sidecar reconnects to replica B before A notices its old stream died.
	onB, err := open(t, dial(t, b.addr), true, w.token, sidecarNode(w.nodeID))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, w.key, connected("replica-b"))
	onA.cancel()
	waitFor(t, func() bool { return a.conns.Streams(w.key) == 0 })
	if err := a.conns.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := readState(t, w.key); got != connected("replica-b") {
		t.Errorf("replica A's disconnect overwrote B's connection: %+v", got)
	}
	onB.cancel()
	waitState(t, w.key, disconnected("replica-b"))
}

// TestDeltaHealthReports checks that HealthInformation requests on a Delta
// stream are reports, as Istio's agent sends them (no error detail: healthy).
func TestDeltaHealthReports(t *testing.T) {
	r := startReplica(t, "replica-a", nil)
	w := register(t, env.Namespace(t), "i-0000000000000000d", "10.0.4.2")
	c, err := open(t, dial(t, r.addr), true, w.token, sidecarNode(w.nodeID))
	if err != nil {
		t.Fatal(err)
	}
	for _, detail := range []*rpcstatus.Status{{Code: int32(codes.Internal), Message: "HTTP probe failed with statuscode: 503"}, nil} {
		if err := c.delta.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: TypeHealthInformation, ErrorDetail: detail}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return len(r.health.all()) == 2 })
	got := r.health.all()
	if got[0].Healthy || got[0].Message != "HTTP probe failed with statuscode: 503" || !got[1].Healthy || got[1].Message != "" || got[1].At.IsZero() {
		t.Errorf("delta health reports = %+v", got)
	}
	if r.conns.Streams(w.key) != 1 {
		t.Error("health reports changed the stream count")
	}
}

// A SotW and a Delta stream open at once get the same number from
// go-control-plane (each protocol counts its own streams from 1): the
// server's bookkeeping must still tell them apart, so that a stream's health
// reports are its own workload's, closing one stream does not orphan the
// other, and two streams of one workload count as two.
func TestSotWAndDeltaStreamsAreTrackedApart(t *testing.T) {
	r := startReplica(t, "replica-a", nil)
	ns := env.Namespace(t)
	a := register(t, ns, "i-0000000000000000a", "10.0.8.1")
	b := register(t, ns, "i-0000000000000000b", "10.0.8.2")
	c := register(t, ns, "i-0000000000000000c", "10.0.8.3")
	conn := dial(t, r.addr)

	// The replica's first SotW and first Delta stream: both number 1.
	onA, err := open(t, conn, false, a.token, sidecarNode(a.nodeID))
	if err != nil {
		t.Fatal(err)
	}
	onB, err := open(t, conn, true, b.token, sidecarNode(b.nodeID))
	if err != nil {
		t.Fatal(err)
	}
	unhealthy := &rpcstatus.Status{Code: int32(codes.Internal), Message: "readiness probe failed"}
	if err := onA.sotw.Send(&discovery.DiscoveryRequest{TypeUrl: TypeHealthInformation, ErrorDetail: unhealthy}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(r.health.workloads()) == 1 })
	if got := r.health.workloads()[0]; got != a.key {
		t.Errorf("a health report on %s's SotW stream was taken as %s's", a.key.Name, got.Name)
	}

	// Closing A's stream leaves B's serving.
	onA.cancel()
	waitFor(t, func() bool { return r.conns.Streams(a.key) == 0 })
	if err := onB.delta.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: TypeHealthInformation}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(r.health.workloads()) == 2 })
	if got := r.health.workloads()[1]; got != b.key {
		t.Errorf("a health report on %s's Delta stream was taken as %s's", b.key.Name, got.Name)
	}
	if n := r.conns.Streams(b.key); n != 1 {
		t.Errorf("%s: %d streams after another workload's stream closed, want 1", b.key.Name, n)
	}

	// One workload with a SotW and a Delta stream (both number 2) holds
	// two streams: closing one leaves it connected.
	sotw, err := open(t, conn, false, c.token, sidecarNode(c.nodeID))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open(t, conn, true, c.token, sidecarNode(c.nodeID)); err != nil {
		t.Fatal(err)
	}
	if n := r.conns.Streams(c.key); n != 2 {
		t.Errorf("%s: %d streams, want 2 (a SotW and a Delta stream)", c.key.Name, n)
	}
	waitState(t, c.key, connected("replica-a"))
	sotw.cancel()
	waitFor(t, func() bool { return r.conns.Streams(c.key) == 1 })
	if err := r.conns.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := readState(t, c.key); got != connected("replica-a") {
		t.Errorf("%s after its SotW stream closed, its Delta stream open: %+v, want connected", c.key.Name, got)
	}
}

func TestHealthReportsAreNotSubscriptions(t *testing.T) {
	r := startReplica(t, "replica-a", nil)
	w := register(t, env.Namespace(t), "i-0000000000000000a", "10.0.4.1")
	c, err := open(t, dial(t, r.addr), false, w.token, sidecarNode(w.nodeID))
	if err != nil {
		t.Fatal(err)
	}
	for _, detail := range []*rpcstatus.Status{nil, {Code: int32(codes.Internal), Message: "readiness probe failed"}} {
		if err := c.sotw.Send(&discovery.DiscoveryRequest{TypeUrl: TypeHealthInformation, ErrorDetail: detail}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return len(r.health.all()) == 2 })
	got := r.health.all()
	if !got[0].Healthy || got[1].Healthy || got[1].Message != "readiness probe failed" {
		t.Errorf("health reports = %+v", got)
	}
	// No HealthInformation response comes back; the stream still serves.
	if err := c.sotw.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	resp, err := c.sotw.Recv(0)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetTypeUrl() != resource.ClusterType {
		t.Errorf("got a response of %s, want only clusters", resp.GetTypeUrl())
	}
	if r.conns.Streams(w.key) != 1 {
		t.Error("health reports changed the stream count")
	}
}

func syncz(t *testing.T, addr string) (*discovery.DiscoveryResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := discovery.NewAggregatedDiscoveryServiceClient(dial(t, addr)).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "debug~0.0.0.0~istioctl~.svc.cluster.local"}, TypeUrl: TypeSyncz}); err != nil {
		return nil, err
	}
	return s.Recv()
}

func TestSynczListsConnectedWorkloads(t *testing.T) {
	r := startReplica(t, "replica-a", nil)
	ns := env.Namespace(t)
	w := register(t, ns, "i-0000000000000000a", "10.0.5.1")
	idle := register(t, ns, "i-0000000000000000b", "10.0.5.2")
	_ = idle
	conn := dial(t, r.addr)
	if _, err := open(t, conn, false, w.token, sidecarNode(w.nodeID)); err != nil {
		t.Fatal(err)
	}
	// A debug client with the workload's token (no PROXY_CONFIG) is not a workload.
	if _, err := open(t, conn, false, w.token, &core.Node{Id: w.nodeID}); err != nil {
		t.Fatal(err)
	}

	resp, err := syncz(t, r.debugAddr)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetControlPlane().GetIdentifier() != `{"ID":"replica-a"}` {
		t.Errorf("control plane = %v", resp.GetControlPlane())
	}
	if len(resp.GetResources()) != 1 {
		t.Fatalf("%d ClientConfigs, want 1", len(resp.GetResources()))
	}
	cc := &statusv3.ClientConfig{}
	if err := resp.GetResources()[0].UnmarshalTo(cc); err != nil {
		t.Fatal(err)
	}
	md := cc.GetNode().GetMetadata().GetFields()
	if cc.GetNode().GetId() != w.key.Name+"."+ns || md["CLUSTER_ID"].GetStringValue() != "vm-cluster" || md["ISTIO_VERSION"].GetStringValue() != "1.30.0" {
		t.Errorf("node = %v", cc.GetNode())
	}
	want := map[string]statusv3.ConfigStatus{
		resource.ListenerType: statusv3.ConfigStatus_SYNCED,
		resource.ClusterType:  statusv3.ConfigStatus_NOT_SENT,
		resource.EndpointType: statusv3.ConfigStatus_NOT_SENT,
		resource.RouteType:    statusv3.ConfigStatus_NOT_SENT,
	}
	got := map[string]statusv3.ConfigStatus{}
	for _, c := range cc.GetGenericXdsConfigs() {
		got[c.GetTypeUrl()] = c.GetConfigStatus()
	}
	for typ, st := range want {
		if got[typ] != st {
			t.Errorf("%s: %v, want %v (all: %v)", typ, got[typ], st, got)
		}
	}

	// The authenticated port never serves debug types.
	c, err := open(t, conn, false, w.token, sidecarNode(w.nodeID))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.sotw.Send(&discovery.DiscoveryRequest{TypeUrl: TypeSyncz}); err != nil {
		t.Fatal(err)
	}
	if err := c.recvErr(); status.Code(err) != codes.PermissionDenied {
		t.Errorf("syncz on the workload port: %v, want PermissionDenied", err)
	}
}

func TestCheckLoopback(t *testing.T) {
	for _, tt := range []struct {
		addr    string
		wantErr bool
	}{
		{"127.0.0.1:15010", false}, {"[::1]:15010", false}, {"localhost:15010", false},
		{":15010", true}, {"0.0.0.0:15010", true}, {"10.0.0.1:15010", true}, {"nonsense", true},
	} {
		if err := CheckLoopback(tt.addr); (err != nil) != tt.wantErr {
			t.Errorf("CheckLoopback(%q) = %v, wantErr %v", tt.addr, err, tt.wantErr)
		}
	}
}

func TestNoGoroutineOutlivesAStream(t *testing.T) {
	r := startReplica(t, "replica-a", nil)
	w := register(t, env.Namespace(t), "i-0000000000000000a", "10.0.6.1")
	conn, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	conn.Connect()
	waitFor(t, func() bool { return conn.GetState().String() == "READY" || conn.GetState().String() == "IDLE" })
	// Everything running now (control plane clients, informers, the server)
	// may stay; what a stream starts must end with it.
	ignore := goleak.IgnoreCurrent()
	for _, delta := range []bool{false, true} {
		c, err := open(t, conn, delta, w.token, sidecarNode(w.nodeID))
		if err != nil {
			t.Fatal(err)
		}
		waitState(t, w.key, connected("replica-a"))
		c.cancel()
		waitState(t, w.key, disconnected("replica-a"))
		// A refused stream leaves nothing behind either.
		if _, err := open(t, conn, delta, "garbage", sidecarNode(w.nodeID)); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("garbage token: %v", err)
		}
	}
	if err := r.conns.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
	goleak.VerifyNone(t, ignore)
}

// A stream lives no longer than the sidecar token that opened it: when the
// token's exp passes (on the server's clock) the server closes the stream
// with Unauthenticated, the workload is marked disconnected, the expired
// token opens nothing and gets no certificate, and the agent's fresh token
// connects it again.
func TestAStreamEndsWhenItsTokenExpires(t *testing.T) {
	w := register(t, env.Namespace(t), "i-0000000000000000e", "10.0.7.1")
	claims, err := boundtoken.Decode(w.token)
	if err != nil {
		t.Fatal(err)
	}
	exp, ok := claims.ExpiresAt()
	if !ok {
		t.Fatal("the sidecar token has no exp")
	}
	// The server's clock runs ahead so the token (valid for an hour) expires
	// a few seconds after the stream opens.
	var skew atomic.Int64
	skew.Store(int64(time.Until(exp) - 4*time.Second))
	clock := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	r := startReplica(t, "replica-a", nil, func(o *Options) { o.Clock = clock })
	conn := dial(t, r.addr)
	c, err := open(t, conn, false, w.token, sidecarNode(w.nodeID))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, w.key, connected("replica-a"))
	errc := make(chan error, 1)
	go func() { errc <- c.recvErr() }()
	select {
	case err := <-errc:
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "expired") {
			t.Errorf("stream ended with %v, want Unauthenticated saying the token expired", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stream outlived its token")
	}
	waitState(t, w.key, disconnected("replica-a"))
	if got := testutil.ToFloat64(r.metrics.closed.WithLabelValues(closeCredentialExpired)); got != 1 {
		t.Errorf("embark_xds_streams_closed_by_server_total{reason=credential_expired} = %v, want 1", got)
	}

	// The expired token opens nothing, also from the review cache.
	if _, err := open(t, conn, true, w.token, sidecarNode(w.nodeID)); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired token: %v, want Unauthenticated saying it expired", err)
	}
	if got := testutil.ToFloat64(r.metrics.refused.WithLabelValues(codes.Unauthenticated.String(), tokenauth.ReasonExpiredToken)); got != 1 {
		t.Errorf("embark_xds_refused_streams_total{reason=expired_token} = %v, want 1", got)
	}
	// Nor does it renew the sidecar's certificate: the CA relay's
	// authorization of a certificate request refuses it the same way.
	caCtx := metadata.NewIncomingContext(t.Context(), metadata.Pairs("authorization", "Bearer "+w.token))
	if _, err := r.server.AuthorizeCertificate(caCtx); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "expired") {
		t.Errorf("certificate request with the expired token: %v, want Unauthenticated saying it expired", err)
	}

	// The agent reconnects with the fresh token of its token file (the
	// clock's skew only served to reach the expiry quickly).
	skew.Store(0)
	if _, err := open(t, conn, false, requestToken(t, w, registry.DefaultXDSAudience, true), sidecarNode(w.nodeID)); err != nil {
		t.Fatalf("fresh token: %v", err)
	}
	waitState(t, w.key, connected("replica-a"))
}

// forgettingConfig serves empty configurations and records the nodes the
// server tells it to forget.
type forgettingConfig struct {
	EmptyConfig
	mu        sync.Mutex
	forgotten []string
}

func (f *forgettingConfig) Forget(node string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgotten = append(f.forgotten, node)
}

func (f *forgettingConfig) all() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.forgotten)
}

// A config source's per-node state is dropped when the node's last stream
// closes, not while another stream of the node is open.
func TestLastStreamClosedForgetsTheNode(t *testing.T) {
	cfg := &forgettingConfig{}
	r := startReplica(t, "replica-a", nil, func(o *Options) { o.Config = cfg })
	w := register(t, env.Namespace(t), "i-0000000000000000f", "10.0.4.3")
	conn := dial(t, r.addr)
	first, err := open(t, conn, false, w.token, sidecarNode(w.nodeID))
	if err != nil {
		t.Fatal(err)
	}
	second, err := open(t, conn, false, w.token, sidecarNode(w.nodeID))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return r.conns.Streams(w.key) == 2 })
	first.cancel()
	waitFor(t, func() bool { return r.conns.Streams(w.key) == 1 })
	if got := cfg.all(); len(got) != 0 {
		t.Fatalf("forgotten while a stream is open: %v", got)
	}
	second.cancel()
	waitFor(t, func() bool { return len(cfg.all()) == 1 })
	if got := cfg.all(); got[0] != w.nodeID {
		t.Errorf("forgotten %v, want %s", got, w.nodeID)
	}
}

// A sidecar of a namespace outside Options.Namespaces (the endpoint's
// workloadNamespaces: its cache does not watch there) is refused at once,
// naming the namespace, on streams and certificate requests alike; not
// answered Unavailable as a cache miss would be.
func TestNamespaceNotServedIsRefused(t *testing.T) {
	ns := env.Namespace(t)
	r := startReplica(t, "replica-a", nil, func(o *Options) { o.Namespaces = []string{"bookinfo"} })
	a := register(t, ns, "i-0000000000000000a", "10.0.1.1")
	conn := dial(t, r.addr)
	for _, delta := range []bool{false, true} {
		_, err := open(t, conn, delta, a.token, sidecarNode(a.nodeID))
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), `"`+ns+`"`) {
			t.Errorf("delta=%v: stream of a workload in %s = %v, want PermissionDenied naming the namespace", delta, ns, err)
		}
	}
	if got := testutil.ToFloat64(r.metrics.refused.WithLabelValues(codes.PermissionDenied.String(), reasonNamespaceNotServed)); got != 2 {
		t.Errorf("refusals counted as %s: %v, want 2", reasonNamespaceNotServed, got)
	}
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs("authorization", "Bearer "+a.token))
	if _, err := r.server.AuthorizeCertificate(ctx); status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), `"`+ns+`"`) {
		t.Errorf("certificate request of a workload in %s = %v, want PermissionDenied naming the namespace", ns, err)
	}
}

// The registry's writers are what the endpoint gives the server.
var (
	_ ConnectionTracker = (*presence.Connections)(nil)
	_ HealthSink        = (*presence.HealthMirror)(nil)
)
