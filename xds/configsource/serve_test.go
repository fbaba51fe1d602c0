package configsource

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/enforcement"
	"github.com/embark-mesh/embark/registry/presence"
	"github.com/embark-mesh/embark/test/adsclient"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/testenv"
	"github.com/embark-mesh/embark/translate"
	"github.com/embark-mesh/embark/xds"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{GarbageCollector: true}, &env) }

// endpoint is an xDS server serving a Source, on loopback.
type endpoint struct {
	addr    string
	source  *Source
	metrics *Metrics
	cache   client.Reader
}

func startEndpoint(t *testing.T) *endpoint {
	t.Helper()
	return startEndpointIn(t)
}

// startEndpointIn is startEndpoint whose informers watch only namespaces
// (none: all).
func startEndpointIn(t *testing.T, namespaces ...string) *endpoint {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log := fixtures.DebugLogger(t)
	warm := append(Watched(), &corev1.SecretList{})
	c, err := env.StartCacheIn(ctx, namespaces, func(c cache.Cache) error { return registry.SetupIndexes(ctx, c) }, warm...)
	if err != nil {
		t.Fatal(err)
	}
	recorder, err := env.EventRecorder(ctx, "onboarding-endpoint")
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	enforcement, err := enforcement.New(enforcement.Options{Client: env.Client, Reader: c, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	src, err := New(Options{
		Cache: c, Mesh: translate.Mesh{TrustDomain: "cluster.local", ClusterID: "Kubernetes"},
		Debounce: 20 * time.Millisecond, Recorder: recorder, Metrics: metrics, Logger: log, Enforcement: enforcement,
	})
	if err != nil {
		t.Fatal(err)
	}
	conns, err := presence.NewConnections(ctx, presence.ConnectionOptions{Client: env.Client, Replica: "replica-a", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := xds.NewServer(ctx, xds.Options{
		Connections: conns, TokenReviews: cs.AuthenticationV1().TokenReviews(),
		Reader: c, APIReader: env.Client, Informers: c, Config: src, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	srv.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(4)
	go func() { defer wg.Done(); enforcement.Run(ctx) }()
	go func() { defer wg.Done(); _ = g.Serve(lis) }()
	go func() { defer wg.Done(); _ = srv.Run(ctx) }()
	go func() {
		defer wg.Done()
		if err := src.Run(ctx, srv); err != nil {
			t.Errorf("configsource Run: %v", err)
		}
	}()
	t.Cleanup(func() {
		g.Stop()
		flush, done := context.WithTimeout(context.Background(), 10*time.Second)
		defer done()
		_ = conns.Flush(flush)
		cancel()
		wg.Wait()
		conns.Wait()
	})
	return &endpoint{addr: lis.Addr().String(), source: src, metrics: metrics, cache: c}
}

// workload is a registered ratings VM (labels app=ratings, class=vm).
type workload struct {
	key    client.ObjectKey
	token  string
	nodeID string
}

func register(t *testing.T, e *endpoint, ns, ip string) *workload {
	t.Helper()
	ctx := t.Context()
	wg := fixtures.WorkloadGroup(ns, map[string]string{"app": "ratings", "class": "vm"})
	fixtures.CreateGroup(ctx, t, env.Client, wg)
	reg, err := registry.NewRegistrar(registry.Options{Client: env.Client, Cache: e.cache, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := reg.Write(ctx, registry.Request{Group: wg, Identity: fixtures.AWSIdentity("i-0000000000000000a"), Registration: fixtures.Registration(ip)})
	if err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(res.Registration)
	return &workload{key: key, token: res.SidecarToken.Token, nodeID: fixtures.NodeID(ip, key)}
}

// stream is a SotW ADS client subscribed to listeners and clusters that
// ACKs every response and keeps the latest of each type.
type stream struct {
	mu     sync.Mutex
	latest map[string]*discovery.DiscoveryResponse
	count  map[string]int
	err    error
}

// openSidecar opens w's SotW stream to e as its sidecar, with its token
// and a node with a ProxyConfig, and requests typeURLs in turn.
func openSidecar(t *testing.T, e *endpoint, w *workload, typeURLs ...string) *adsclient.SotW {
	t.Helper()
	conn, err := adsclient.Dial(e.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	node := &core.Node{Id: w.nodeID, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"PROXY_CONFIG": structpb.NewStructValue(&structpb.Struct{}),
	}}}
	ads, err := adsclient.OpenSotW(t.Context(), conn, w.token, node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ads.Close)
	for _, typ := range typeURLs {
		if err := ads.Request(typ); err != nil {
			t.Fatal(err)
		}
	}
	return ads
}

func subscribe(t *testing.T, e *endpoint, w *workload) *stream {
	t.Helper()
	ads := openSidecar(t, e, w, resource.ListenerType, resource.ClusterType)
	s := &stream{latest: map[string]*discovery.DiscoveryResponse{}, count: map[string]int{}}
	go func() {
		for {
			resp, err := ads.Next()
			if err != nil {
				s.mu.Lock()
				s.err = err
				s.mu.Unlock()
				return
			}
			s.mu.Lock()
			s.latest[resp.GetTypeUrl()] = resp
			s.count[resp.GetTypeUrl()]++
			s.mu.Unlock()
			_ = ads.ACK(resp)
		}
	}()
	return s
}

// names are the names of the latest resources of typ.
func (s *stream) names(t *testing.T, typ string) (names []string, version string, responses int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := s.latest[typ]
	for _, a := range resp.GetResources() {
		var name string
		switch typ {
		case resource.ListenerType:
			l := &listenerv3.Listener{}
			if err := a.UnmarshalTo(l); err != nil {
				t.Fatal(err)
			}
			name = l.GetName()
		case resource.ClusterType:
			c := &clusterv3.Cluster{}
			if err := a.UnmarshalTo(c); err != nil {
				t.Fatal(err)
			}
			name = c.GetName()
		}
		names = append(names, name)
	}
	slices.Sort(names)
	return names, resp.GetVersionInfo(), s.count[typ]
}

// waitNames waits until the latest resources of typ satisfy ok.
func (s *stream) waitNames(t *testing.T, what, typ string, ok func([]string) bool) string {
	t.Helper()
	var got []string
	var version string
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		got, version, _ = s.names(t, typ)
		return ok(got), nil
	})
	if err != nil {
		s.mu.Lock()
		streamErr := s.err
		s.mu.Unlock()
		t.Fatalf("%s: %s is %v (stream error %v)", what, typ, got, streamErr)
	}
	return version
}

func has(name string) func([]string) bool {
	return func(names []string) bool { return slices.Contains(names, name) }
}

func hasNot(name string) func([]string) bool {
	return func(names []string) bool { return !slices.Contains(names, name) }
}

func seed004Sidecar(ns string) *istionetworkingv1.Sidecar {
	sc := &istionetworkingv1.Sidecar{ObjectMeta: metav1.ObjectMeta{Name: "bookinfo-ratings-no-iptables", Namespace: ns}}
	sc.Spec.WorkloadSelector = &istioapi.WorkloadSelector{Labels: map[string]string{"app": "ratings", "class": "vm"}}
	sc.Spec.Ingress = []*istioapi.IstioIngressListener{{
		DefaultEndpoint: "127.0.0.1:8080",
		Port:            &istioapi.SidecarPort{Name: "http", Number: 8080, Protocol: "HTTP"},
	}}
	sc.Spec.Egress = []*istioapi.IstioEgressListener{{
		Bind:  "127.0.0.2",
		Port:  &istioapi.SidecarPort{Name: "http", Number: 8080, Protocol: "HTTP"},
		Hosts: []string{"./*"},
	}}
	return sc
}

func detailsService(ns string) (*corev1.Service, *discoveryv1.EndpointSlice) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "details", Namespace: ns}}
	svc.Spec.Selector = map[string]string{"app": "details"}
	svc.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 8080}}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "details-abc", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "details"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(9080))}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.12"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
	return svc, es
}

// TestConfigurationFollowsTheInputs creates, updates and deletes a Sidecar
// and a Service while the workload is connected and checks what arrives on
// its stream; an invalid Sidecar leaves the previous configuration and an
// Event.
func TestConfigurationFollowsTheInputs(t *testing.T) {
	e := startEndpoint(t)
	ns := env.Namespace(t)
	w := register(t, e, ns, "10.0.0.10")
	ctx := t.Context()
	svc, es := detailsService(ns)
	for _, o := range []client.Object{svc, es} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	s := subscribe(t, e, w)
	// No Sidecar: the documented default (nothing).
	s.waitNames(t, "before any Sidecar", resource.ListenerType, func(n []string) bool {
		_, _, responses := s.names(t, resource.ListenerType)
		return responses > 0 && len(n) == 0
	})

	// Sidecar created: ingress on the host address, egress on 127.0.0.2.
	sc := seed004Sidecar(ns)
	if err := env.Client.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	s.waitNames(t, "Sidecar created", resource.ListenerType, func(n []string) bool { return has("10.0.0.10_8080")(n) && has("127.0.0.2_8080")(n) })
	details := "outbound|8080||details." + ns + ".svc.cluster.local"
	s.waitNames(t, "Sidecar created", resource.ClusterType, has(details))

	// Service deleted: its cluster goes.
	if err := env.Client.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
	s.waitNames(t, "Service deleted", resource.ClusterType, hasNot(details))
	// Service created again: it comes back.
	svc, _ = detailsService(ns)
	if err := env.Client.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	s.waitNames(t, "Service recreated", resource.ClusterType, has(details))

	// Invalid Sidecar: the previous configuration stays, an Event says why.
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc); err != nil {
		t.Fatal(err)
	}
	sc.Spec.Egress[0].Bind = "not-an-ip"
	if err := env.Client.Update(ctx, sc); err != nil {
		t.Fatal(err)
	}
	var ev *corev1.Event
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		l := &corev1.EventList{}
		if err := env.Client.List(ctx, l, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for i := range l.Items {
			if it := &l.Items[i]; it.Reason == ReasonInvalidConfiguration && it.InvolvedObject.Kind == "Sidecar" && it.InvolvedObject.Name == sc.Name {
				ev = it
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no InvalidConfiguration Event on the Sidecar: %v", err)
	}
	if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, "spec.egress[0].bind") {
		t.Errorf("Event %s %q, want a Warning naming spec.egress[0].bind", ev.Type, ev.Message)
	}
	if got := testutil.ToFloat64(e.metrics.errors.WithLabelValues(reasonSidecar)); got < 1 {
		t.Errorf("embark_xds_config_errors_total{reason=sidecar} = %v", got)
	}
	names, _, _ := s.names(t, resource.ListenerType)
	if !has("127.0.0.2_8080")(names) {
		t.Errorf("the invalid Sidecar replaced the configuration: listeners %v", names)
	}
	// While invalid, other changes keep the previous configuration too.
	if err := env.Client.Delete(ctx, svc); err != nil {
		t.Fatal(err)
	}
	// Fixed: the configuration follows again (and the deleted Service is gone).
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc); err != nil {
		t.Fatal(err)
	}
	sc.Spec.Egress[0].Bind = "127.0.0.3"
	if err := env.Client.Update(ctx, sc); err != nil {
		t.Fatal(err)
	}
	s.waitNames(t, "Sidecar fixed", resource.ListenerType, func(n []string) bool { return has("127.0.0.3_8080")(n) && hasNot("127.0.0.2_8080")(n) })
	s.waitNames(t, "Sidecar fixed", resource.ClusterType, hasNot(details))

	// Served but with something left out (ALLOW_ANY is not translated): a
	// Warning Event says what.
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc); err != nil {
		t.Fatal(err)
	}
	sc.Spec.OutboundTrafficPolicy = &istioapi.OutboundTrafficPolicy{Mode: istioapi.OutboundTrafficPolicy_ALLOW_ANY}
	if err := env.Client.Update(ctx, sc); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		l := &corev1.EventList{}
		if err := env.Client.List(ctx, l, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for i := range l.Items {
			it := &l.Items[i]
			if it.Reason == ReasonConfigurationWarning && it.InvolvedObject.Name == sc.Name && strings.Contains(it.Message, "outboundTrafficPolicy") {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no ConfigurationWarning Event naming spec.outboundTrafficPolicy on the Sidecar: %v", err)
	}
	if names, _, _ := s.names(t, resource.ListenerType); !has("127.0.0.3_8080")(names) {
		t.Errorf("a configuration with warnings was not served: listeners %v", names)
	}

	// Sidecar deleted: back to the default.
	if err := env.Client.Delete(ctx, sc); err != nil {
		t.Fatal(err)
	}
	s.waitNames(t, "Sidecar deleted", resource.ListenerType, func(n []string) bool { return len(n) == 0 })
}
