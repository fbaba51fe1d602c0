package adversarial

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	istioapiv1alpha3 "istio.io/api/networking/v1alpha3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istionetworkingv1alpha3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/presence"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/testenv"
	"github.com/embark-mesh/embark/xds"
	"github.com/embark-mesh/embark/xds/relay"
	"github.com/embark-mesh/embark/xds/upstream"
)

// The node metadata attacks run Embark's xDS server in istiod mode: its
// relay to a real istiod (pilot-discovery) on the package's API server. What
// is asked is what istiod computes for a VM's genuine, authenticated stream
// whose node metadata claims to be another workload.

// relayPlane is Embark's xDS server in istiod mode and the istiod behind it.
type relayPlane struct {
	conn  *grpc.ClientConn
	cache cache.Cache
}

// startRelayXDS starts istiod and Embark's xDS server relaying to it, as
// the endpoint wires istiod mode (upstream.Dial with istiod's root and
// server name).
func startRelayXDS(t *testing.T) *relayPlane {
	t.Helper()
	i, err := testenv.StartIstiod(t.Context(), env, testenv.IstiodOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			log := strings.Split(strings.TrimRight(i.Log(), "\n"), "\n")
			t.Logf("istiod log (tail):\n%s", strings.Join(log[max(0, len(log)-40):], "\n"))
		}
		_ = i.Close()
	})
	ctx, cancel := context.WithCancel(context.Background())
	roots := filepath.Join(t.TempDir(), "root-cert.pem")
	if err := os.WriteFile(roots, i.RootCert, 0o600); err != nil {
		t.Fatal(err)
	}
	up, err := upstream.Dial(ctx, upstream.Options{Address: i.SecureGRPCAddr, ServerName: testenv.IstiodServerName, RootCertFile: roots, BackoffMax: 2 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(relay.Options{Conn: up, MaxBackoff: 2 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := env.StartCache(ctx, func(c cache.Cache) error { return registry.SetupIndexes(ctx, c) },
		&runtimev1alpha1.WorkloadAutoRegistrationList{}, &corev1.SecretList{}, &istionetworkingv1.WorkloadEntryList{})
	if err != nil {
		t.Fatal(err)
	}
	conns, err := presence.NewConnections(ctx, presence.ConnectionOptions{Client: env.Client, Replica: "adversarial-relay", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := xds.NewServer(ctx, xds.Options{
		Connections: conns, TokenReviews: cs.AuthenticationV1().TokenReviews(),
		Reader: c, APIReader: env.Client, Informers: c, Relay: r, Logger: slog.New(slog.DiscardHandler),
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
	wg.Add(2)
	go func() { defer wg.Done(); _ = g.Serve(lis) }()
	go func() { defer wg.Done(); _ = srv.Run(ctx) }()
	t.Cleanup(func() {
		g.Stop()
		cancel()
		wg.Wait()
		conns.Wait()
		_ = up.Close()
	})
	return &relayPlane{conn: dialFrom(t, "127.0.0.1", lis.Addr().String()), cache: c}
}

// vm is a registered workload: its group's labels, address and sidecar.
type vm struct {
	sidecar
	ip     string
	labels map[string]string
}

// registerVM registers an EC2 workload at ip in a new WorkloadGroup group of
// ns whose template sets labels, as the endpoint does after verifying it.
func (p *relayPlane) registerVM(t *testing.T, ns, group string, labels map[string]string, instance, ip string) *vm {
	t.Helper()
	wg := fixtures.WorkloadGroup(ns, labels)
	wg.Name = group
	fixtures.CreateGroup(t.Context(), t, env.Client, wg)
	reg, err := registry.NewRegistrar(registry.Options{Client: env.Client, Cache: p.cache, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := reg.Write(t.Context(), registry.Request{Group: wg, Identity: fixtures.AWSIdentity(instance), Registration: fixtures.Registration(ip), AddressProven: true})
	if err != nil {
		t.Fatalf("register %s/%s: %v", ns, group, err)
	}
	key := client.ObjectKeyFromObject(res.Registration)
	return &vm{sidecar: sidecar{key: key, token: res.SidecarToken.Token, nodeID: fixtures.NodeID(ip, key)}, ip: ip, labels: labels}
}

// node is what pilot-agent on the VM sends (its cluster.env's metadata),
// with labels and instanceIPs as given.
func (w *vm) node(labels map[string]string, instanceIPs string) *core.Node {
	n := nodeOf(w.nodeID)
	lv := make(map[string]any, len(labels))
	for k, v := range labels {
		lv[k] = v
	}
	ls, _ := structpb.NewStruct(lv)
	for k, v := range map[string]*structpb.Value{
		"NAMESPACE":       structpb.NewStringValue(w.key.Namespace),
		"SERVICE_ACCOUNT": structpb.NewStringValue(fixtures.ServiceAccount),
		"CLUSTER_ID":      structpb.NewStringValue("Kubernetes"),
		"INSTANCE_IPS":    structpb.NewStringValue(instanceIPs),
		"LABELS":          structpb.NewStructValue(ls),
	} {
		n.Metadata.Fields[k] = v
	}
	return n
}

// clusters opens a stream through Embark as token with node and returns the
// names of the clusters in istiod's first CDS answer.
func (p *relayPlane) clusters(t *testing.T, token string, node *core.Node) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+token), time.Minute)
	defer cancel()
	s, err := discovery.NewAggregatedDiscoveryServiceClient(p.conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatalf("CDS of %s: %v", node.GetId(), err)
	}
	var names []string
	for _, a := range resp.GetResources() {
		c := &clusterv3.Cluster{}
		if err := a.UnmarshalTo(c); err != nil {
			t.Fatal(err)
		}
		names = append(names, c.GetName())
	}
	return names
}

// waitClusters waits until the CDS istiod computes for the genuine node of
// w holds the cluster want: istiod has then seen the configuration that
// makes it.
func (p *relayPlane) waitClusters(t *testing.T, w *vm, want string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		got := p.clusters(t, w.token, w.node(w.labels, w.ip))
		if slices.Contains(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("istiod never gave %s its own cluster %s: %v", w.key, want, got)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// envoyFilterAddingCluster is an EnvoyFilter of ns selecting labels that
// adds the static cluster name to the outbound clusters of the proxies it
// selects: configuration meant for those workloads only.
func envoyFilterAddingCluster(t *testing.T, ns string, labels map[string]string, name string) *istionetworkingv1alpha3.EnvoyFilter {
	t.Helper()
	value, err := structpb.NewStruct(map[string]any{
		"name": name, "type": "STATIC", "connect_timeout": "1s",
		"load_assignment": map[string]any{"cluster_name": name, "endpoints": []any{map[string]any{"lb_endpoints": []any{
			map[string]any{"endpoint": map[string]any{"address": map[string]any{"socket_address": map[string]any{"address": "10.200.0.1", "port_value": 443}}}},
		}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return &istionetworkingv1alpha3.EnvoyFilter{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: istioapiv1alpha3.EnvoyFilter{
			WorkloadSelector: &istioapiv1alpha3.WorkloadSelector{Labels: labels},
			ConfigPatches: []*istioapiv1alpha3.EnvoyFilter_EnvoyConfigObjectPatch{{
				ApplyTo: istioapiv1alpha3.EnvoyFilter_CLUSTER,
				Match:   &istioapiv1alpha3.EnvoyFilter_EnvoyConfigObjectMatch{Context: istioapiv1alpha3.EnvoyFilter_SIDECAR_OUTBOUND},
				Patch:   &istioapiv1alpha3.EnvoyFilter_Patch{Operation: istioapiv1alpha3.EnvoyFilter_Patch_ADD, Value: value},
			}},
		},
	}
}

// A genuine VM of group ratings (labels app=ratings) sends, on its own
// authenticated stream, node metadata claiming another workload: LABELS of
// the reviews workloads (with istio.io/test-vm, which makes istiod take the
// metadata's labels as the proxy's), or INSTANCE_IPS of the payments VM of
// another namespace (istiod finds a proxy's Service targets, its inbound
// listeners and clusters, by those addresses). istiod must compute the
// ratings VM whatever it sends: neither the EnvoyFilter meant for reviews
// nor the inbound cluster of payments' port 7070 may reach it. Each victim's
// own stream gets them (istiod has the configuration).
func TestRelayedNodeMetadataClaimsAnotherWorkload(t *testing.T) {
	p := startRelayXDS(t)
	ns, other := env.Namespace(t), env.Namespace(t)
	ctx := t.Context()
	const reviewsOnly = "reviews-only-backend"
	const paymentsInbound = "inbound|7070||"
	payments := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "payments", Namespace: other},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "payments"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 7070, TargetPort: intstr.FromInt32(7070)}},
		},
	}
	for _, o := range []client.Object{envoyFilterAddingCluster(t, ns, map[string]string{"app": "reviews"}, reviewsOnly), payments} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	ratings := p.registerVM(t, ns, "ratings", map[string]string{"app": "ratings"}, "i-0aaaaaaaaaaaaaa41", "10.2.0.1")
	reviews := p.registerVM(t, ns, "reviews", map[string]string{"app": "reviews"}, "i-0aaaaaaaaaaaaaa42", "10.2.0.2")
	paid := p.registerVM(t, other, "payments", map[string]string{"app": "payments"}, "i-0aaaaaaaaaaaaaa43", "10.2.0.3")
	p.waitClusters(t, reviews, reviewsOnly)
	p.waitClusters(t, paid, paymentsInbound)

	t.Run("LABELS of another workload", func(t *testing.T) {
		Attack(t, "istiod mode: a VM's node metadata LABELS (app=reviews, istio.io/test-vm) get it another workload's EnvoyFilter")
		claimed := map[string]string{"app": "reviews", "istio.io/test-vm": "true"}
		if got := p.clusters(t, ratings.token, ratings.node(claimed, ratings.ip)); slices.Contains(got, reviewsOnly) {
			t.Errorf("the ratings VM claiming LABELS %v got the reviews EnvoyFilter's cluster %s", claimed, reviewsOnly)
		}
	})
	t.Run("INSTANCE_IPS of another namespace's workload", func(t *testing.T) {
		Attack(t, "istiod mode: a VM's node metadata INSTANCE_IPS (another namespace's VM) get it that workload's inbound listeners")
		if got := p.clusters(t, ratings.token, ratings.node(ratings.labels, paid.ip)); slices.Contains(got, paymentsInbound) {
			t.Errorf("the ratings VM claiming INSTANCE_IPS %s got %s's inbound cluster %s", paid.ip, paid.key, paymentsInbound)
		}
	})
}
