package multinetwork

import (
	"context"
	"os"
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/anypb"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// shippedGateway is the east-west gateway's configuration as the
// IstioOperator overlay installs it (the chart renders the same Gateway and
// VirtualService, manifests' TestMultiNetworkChartMatchesOverlay): Embark's
// ClusterIP Service, Istio's cross-network server (SNI auto-passthrough of
// *.local on 15443) and Embark's host passed through by SNI on 15443 and
// 15012.
const shippedGateway = "../../manifests/istio-operator-multi-network/gateway.yaml"

// createShipped creates the objects of the YAML file path and deletes them
// when the test ends.
func createShipped(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var obj client.Object
		switch kind := kindOf(t, doc); kind {
		case "Service":
			obj = &corev1.Service{}
		case "Gateway":
			obj = &istionetworkingv1.Gateway{}
		case "VirtualService":
			obj = &istionetworkingv1.VirtualService{}
		default:
			t.Fatalf("%s: unexpected kind %q", path, kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if err := env.Client.Create(t.Context(), obj); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}
}

func kindOf(t *testing.T, doc string) string {
	t.Helper()
	var meta struct {
		Kind string `json:"kind"`
	}
	if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
		t.Fatal(err)
	}
	return meta.Kind
}

// The east-west gateway, as an xDS client of istiod (a router with the
// gateway's node metadata), gets what carries a VM's mesh traffic to the
// pods: a 15443 listener that reads the SNI and a cluster per Service port
// named by that SNI (sni-dnat), whose endpoints are the pods' own
// addresses; and what carries the VM's onboarding and xDS to Embark: filter
// chains for the endpoint's DNS name on 15443 and 15012 to Embark's Service.
func TestEastWestGatewayPassesVMTrafficToPodsAndEmbark(t *testing.T) {
	setMeshNetworks(t, "")
	createShipped(t, shippedGateway)
	ns := env.Namespace(t)
	podIP := "10.244.1.16"
	productpage(t, ns, podIP)

	gw := eastWestGateway(t)
	gw.subscribe(t, resource.ClusterType)
	gw.subscribe(t, resource.ListenerType)
	sniCluster := "outbound_.9080_._.productpage." + ns + ".svc.cluster.local"
	clusters := gw.waitFor(t, resource.ClusterType, "the sni-dnat cluster "+sniCluster, func(m map[string]*anypb.Any) bool {
		_, ok := m[sniCluster]
		return ok
	})
	listeners := gw.waitFor(t, resource.ListenerType, "listeners on 15443 and 15012", func(m map[string]*anypb.Any) bool {
		_, a := m["0.0.0.0_15443"]
		_, b := m["0.0.0.0_15012"]
		return a && b
	})
	for _, tc := range []struct{ listener, sni, cluster string }{
		{"0.0.0.0_15443", sniCluster, sniCluster},
		{"0.0.0.0_15443", endpointHost, "outbound|15443||onboarding-endpoint.istio-system.svc.cluster.local"},
		{"0.0.0.0_15012", endpointHost, "outbound|15012||onboarding-endpoint.istio-system.svc.cluster.local"},
	} {
		if got := sniRoutes(t, listeners[tc.listener])[tc.sni]; got != tc.cluster {
			t.Errorf("listener %s: SNI %s goes to cluster %q, want %q", tc.listener, tc.sni, got, tc.cluster)
		}
	}
	c := &cluster.Cluster{}
	if err := clusters[sniCluster].UnmarshalTo(c); err != nil {
		t.Fatal(err)
	}
	if c.GetType() != cluster.Cluster_EDS {
		t.Fatalf("cluster %s: discovery type %v, want EDS", sniCluster, c.GetType())
	}
	gw.subscribe(t, resource.EndpointType, sniCluster)
	gw.waitEndpoints(t, sniCluster, podIP+":9080")
}

// sniRoutes returns, for each server name a filter chain of l matches, the
// cluster its TCP proxy sends the connection to.
func sniRoutes(t *testing.T, l *anypb.Any) map[string]string {
	t.Helper()
	lis := &listener.Listener{}
	if err := l.UnmarshalTo(lis); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, fc := range lis.GetFilterChains() {
		for _, f := range fc.GetFilters() {
			tp := &tcpproxy.TcpProxy{}
			if f.GetTypedConfig().UnmarshalTo(tp) != nil {
				continue
			}
			for _, sni := range fc.GetFilterChainMatch().GetServerNames() {
				out[sni] = tp.GetCluster()
			}
		}
	}
	return out
}
