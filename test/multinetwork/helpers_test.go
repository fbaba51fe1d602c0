package multinetwork

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/registry/nodeid"
	"github.com/embark-mesh/embark/test/endpointkit"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/meshkit"
	"github.com/embark-mesh/embark/test/meshnet"
	"github.com/embark-mesh/embark/test/testenv"
)

// endpoint is one onboarding endpoint (app.Run) relaying to the test
// istiod; its xDS listener serves TLS for endpointHost.
type endpoint struct {
	xds   string
	roots *x509.CertPool
}

// startEndpoint runs the endpoint for ns until the test ends.
func startEndpoint(t *testing.T, ns string) *endpoint {
	t.Helper()
	dir := t.TempDir()
	istiodRoots := filepath.Join(dir, "istiod-root-cert.pem")
	if err := os.WriteFile(istiodRoots, istiod.RootCert, 0o600); err != nil {
		t.Fatal(err)
	}
	ca, err := fixtures.NewCA("embark test root")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := ca.ServingCert(dir, endpointHost)
	if err != nil {
		t.Fatal(err)
	}
	cfg := configkit.Serving(configkit.Config(ns), certFile, keyFile)
	cfg.Endpoint.Hosts = []string{endpointHost}
	cfg.Registration.GracePeriod = configkit.Duration(time.Hour)
	cfg.Istiod = config.Istiod{Address: istiod.SecureGRPCAddr, ServerName: testenv.IstiodServerName, RootCertFile: istiodRoots}
	ep := endpointkit.Start(t, endpointkit.Options{Config: cfg, Kubeconfig: env.KubeconfigPath, Replica: "replica-" + ns, Dir: dir})
	e := &endpoint{xds: ep.Config.Listen.XDS, roots: ca.Pool()}
	return e
}

// ratingsGroup creates the bookinfo ratings WorkloadGroup on vmNetwork, its
// service account and the ratings Service that selects it.
func ratingsGroup(t *testing.T, ns string) *istionetworkingv1.WorkloadGroup {
	t.Helper()
	wg := fixtures.WorkloadGroup(ns, map[string]string{"app": "ratings", "version": "v5"})
	wg.Spec.Metadata = &istioapi.WorkloadGroup_ObjectMeta{Labels: map[string]string{"app": "ratings", "version": "v5"}}
	wg.Spec.Template.Network, wg.Spec.Template.Ports = vmNetwork, map[string]uint32{"http": 9080}
	createService(t, ns, "ratings", 9080)
	fixtures.CreateGroup(t.Context(), t, env.Client, wg)
	return wg
}

// createService creates a Service name selecting app=name on port.
func createService(t *testing.T, ns, name string, port int32) {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": name},
		Ports:    []corev1.ServicePort{{Name: "http", Port: port, TargetPort: intstr.FromInt32(port)}},
	}}
	if err := env.Client.Create(t.Context(), svc); err != nil {
		t.Fatal(err)
	}
}

// productpage creates the bookinfo productpage Service with one running,
// injected Pod at podIP and its EndpointSlice (meshnet.CreatePodService).
func productpage(t *testing.T, ns, podIP string) {
	t.Helper()
	if err := meshnet.CreatePodService(t.Context(), env.Client, meshnet.PodService{
		Namespace: ns, Name: "productpage", Port: 9080, PodName: "productpage-v1-0", PodIP: podIP,
	}); err != nil {
		t.Fatal(err)
	}
}

// workload is a registered VM.
type workload struct{ *meshkit.VM }

// register registers VM n of wg through the registry, as the onboarding
// endpoint does; its address is 10.0.0.n.
func register(t *testing.T, wg *istionetworkingv1.WorkloadGroup, n int) *workload {
	t.Helper()
	return &workload{meshkit.Register(t, env, wg, n, fmt.Sprintf("10.0.0.%d", n))}
}

// adsClient is one ADS stream: it subscribes, ACKs every response as Envoy
// does and keeps the latest resources of each type by name.
type adsClient struct {
	st discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient

	mu      sync.Mutex
	node    *core.Node                       // sent with the first request, then nil
	names   map[string][]string              // subscribed names by type
	latest  map[string]map[string]*anypb.Any // resources by type and name
	changed chan struct{}
	err     error
	// everEDS holds every endpoint address each cluster was ever served.
	everEDS map[string]map[string]bool
}

// vmSidecar opens w's ADS stream to Embark over TLS with its bearer token,
// as pilot-agent does.
func (w *workload) vmSidecar(t *testing.T, e *endpoint) *adsClient {
	t.Helper()
	creds := credentials.NewTLS(&tls.Config{RootCAs: e.roots, ServerName: endpointHost, MinVersion: tls.VersionTLS12})
	ctx := metadata.AppendToOutgoingContext(context.WithoutCancel(t.Context()), "authorization", "Bearer "+w.Token)
	node := &core.Node{Id: w.NodeID, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"PROXY_CONFIG":  structpb.NewStructValue(&structpb.Struct{}),
		"ISTIO_VERSION": structpb.NewStringValue("1.31.0"),
	}}}
	return dial(t, ctx, e.xds, grpc.WithTransportCredentials(creds), node)
}

// podProxy opens the ADS stream of productpage's sidecar in ns on the pods'
// network to istiod's plaintext port (which authenticates nobody; tests
// only), with the node metadata the sidecar injector gives it.
func podProxy(t *testing.T, ns string) *adsClient {
	t.Helper()
	node := &core.Node{
		Id: nodeid.Build("10.244.0.9", types.NamespacedName{Namespace: ns, Name: "productpage-v1-0"}),
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			"CLUSTER_ID":    structpb.NewStringValue("Kubernetes"),
			"NETWORK":       structpb.NewStringValue(podNetwork),
			"NAMESPACE":     structpb.NewStringValue(ns),
			"ISTIO_VERSION": structpb.NewStringValue("1.31.0"),
			"LABELS":        labels(map[string]string{"app": "productpage"}),
		}},
	}
	return dial(t, context.WithoutCancel(t.Context()), istiod.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), node)
}

// eastWestGateway opens the ADS stream of Istio's east-west gateway as its
// Deployment runs it (samples/multicluster/gen-eastwest-gateway.sh): a
// router in istio-system with the gateway's labels, ROUTER_MODE sni-dnat and
// the pods' network as the network it routes within.
func eastWestGateway(t *testing.T) *adsClient {
	t.Helper()
	ns := testenv.IstiodNamespace
	node := &core.Node{
		Id: nodeid.BuildRouter("10.244.0.20", types.NamespacedName{Namespace: ns, Name: "istio-eastwestgateway-7d9f8-x2v4k"}),
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			"CLUSTER_ID":             structpb.NewStringValue("Kubernetes"),
			"NETWORK":                structpb.NewStringValue(podNetwork),
			"NAMESPACE":              structpb.NewStringValue(ns),
			"ISTIO_VERSION":          structpb.NewStringValue("1.31.0"),
			"ROUTER_MODE":            structpb.NewStringValue("sni-dnat"),
			"REQUESTED_NETWORK_VIEW": structpb.NewStringValue(podNetwork),
			"LABELS": labels(map[string]string{
				"istio": "eastwestgateway", "app": "istio-eastwestgateway", "topology.istio.io/network": podNetwork,
			}),
		}},
	}
	return dial(t, context.WithoutCancel(t.Context()), istiod.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), node)
}

func labels(m map[string]string) *structpb.Value {
	f := make(map[string]*structpb.Value, len(m))
	for k, v := range m {
		f[k] = structpb.NewStringValue(v)
	}
	return structpb.NewStructValue(&structpb.Struct{Fields: f})
}

// dial opens an ADS stream to addr; the first request carries node.
func dial(t *testing.T, ctx context.Context, addr string, creds grpc.DialOption, node *core.Node) *adsClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, creds)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(func() { cancel(); _ = conn.Close() })
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &adsClient{st: st, names: map[string][]string{}, latest: map[string]map[string]*anypb.Any{}, changed: make(chan struct{}, 1), everEDS: map[string]map[string]bool{}}
	c.node = node
	go c.receive()
	return c
}

// subscribe asks for resources of typeURL (all of them when names is
// empty).
func (c *adsClient) subscribe(t *testing.T, typeURL string, names ...string) {
	t.Helper()
	c.mu.Lock()
	c.names[typeURL] = names
	req := &discovery.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names}
	if c.node != nil {
		req.Node, c.node = c.node, nil
	}
	c.mu.Unlock()
	if err := c.st.Send(req); err != nil {
		t.Fatal(err)
	}
}

// receive stores and ACKs every response until the stream ends.
func (c *adsClient) receive() {
	for {
		resp, err := c.st.Recv()
		if err != nil {
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			c.notify()
			return
		}
		c.mu.Lock()
		byName := map[string]*anypb.Any{}
		if resp.GetTypeUrl() == resource.EndpointType || resp.GetTypeUrl() == resource.RouteType {
			// Incremental by name in SotW: keep the others.
			for k, v := range c.latest[resp.GetTypeUrl()] {
				byName[k] = v
			}
		}
		for _, r := range resp.GetResources() {
			name := resourceName(r)
			byName[name] = r
			if resp.GetTypeUrl() == resource.EndpointType {
				got, _ := endpoints(byName, name)
				if c.everEDS[name] == nil {
					c.everEDS[name] = map[string]bool{}
				}
				for a := range got {
					c.everEDS[name][a] = true
				}
			}
		}
		c.latest[resp.GetTypeUrl()] = byName
		names := c.names[resp.GetTypeUrl()]
		c.mu.Unlock()
		_ = c.st.Send(&discovery.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(),
			ResponseNonce: resp.GetNonce(), ResourceNames: names})
		c.notify()
	}
}

func (c *adsClient) notify() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// waitFor waits until ok holds for the latest resources of typeURL and
// returns them; what names the expectation in the failure.
func (c *adsClient) waitFor(t *testing.T, typeURL, what string, ok func(map[string]*anypb.Any) bool) map[string]*anypb.Any {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		c.mu.Lock()
		got, err := c.latest[typeURL], c.err
		c.mu.Unlock()
		if ok(got) {
			return got
		}
		if err != nil {
			t.Fatalf("stream ended before %s: %v", what, err)
		}
		select {
		case <-c.changed:
		case <-timeout:
			t.Fatalf("never served %s; last %d resources of %s: %v\nistiod log (tail):\n%s", what, len(got), typeURL, keys(got), meshkit.Tail(istiod.Log()))
		}
	}
}

// endpoints returns the addresses ("ip:port") of cluster's endpoints in
// the latest EDS, and whether EDS held cluster at all.
func endpoints(latest map[string]*anypb.Any, cluster string) (map[string]bool, bool) {
	r, ok := latest[cluster]
	if !ok {
		return nil, false
	}
	cla := &endpointv3.ClusterLoadAssignment{}
	if err := r.UnmarshalTo(cla); err != nil {
		return nil, false
	}
	out := map[string]bool{}
	for _, le := range cla.GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			out[net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))] = true
		}
	}
	return out, true
}

// waitEndpoints waits until cluster's endpoints are exactly want.
func (c *adsClient) waitEndpoints(t *testing.T, cluster string, want ...string) {
	t.Helper()
	c.waitFor(t, resource.EndpointType, fmt.Sprintf("endpoints %v of %s", want, cluster), func(m map[string]*anypb.Any) bool {
		got, ok := endpoints(m, cluster)
		if !ok || len(got) != len(want) {
			return false
		}
		for _, w := range want {
			if !got[w] {
				return false
			}
		}
		return true
	})
}

// everServed reports whether addr was ever an endpoint of cluster.
func (c *adsClient) everServed(cluster, addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.everEDS[cluster][addr]
}

// outbound is the name of the outbound cluster of service in ns on port.
func outbound(ns, service string, port int) string {
	return fmt.Sprintf("outbound|%d||%s.%s.svc.cluster.local", port, service, ns)
}

// resourceName is the name of an xDS resource (a ClusterLoadAssignment's
// cluster name, every other type's name).
func resourceName(r *anypb.Any) string {
	m, err := r.UnmarshalNew()
	if err != nil {
		return ""
	}
	switch v := m.(type) {
	case interface{ GetClusterName() string }:
		return v.GetClusterName()
	case interface{ GetName() string }:
		return v.GetName()
	}
	return ""
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
