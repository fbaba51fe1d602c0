package multinetwork

import (
	"context"
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

// The east-west gateway's configuration as docs/multi-network.md installs
// it: Istio's cross-network server (SNI auto-passthrough of *.local on
// 15443) and Embark's ports passed through by SNI (15443) and port (15012)
// to Embark's Service.
const (
	gatewayYAML = `
apiVersion: networking.istio.io/v1
kind: Gateway
metadata:
  name: vmgateway
  namespace: istio-system
spec:
  selector:
    istio: eastwestgateway
  servers:
  - port: {number: 15443, name: tls-mesh, protocol: TLS}
    tls: {mode: AUTO_PASSTHROUGH}
    hosts: ["*.local"]
  - port: {number: 15443, name: tls-onboarding, protocol: TLS}
    tls: {mode: PASSTHROUGH}
    hosts: ["onboarding-endpoint.example.corp"]
  - port: {number: 15012, name: tls-xds, protocol: TLS}
    tls: {mode: PASSTHROUGH}
    hosts: ["onboarding-endpoint.example.corp"]
`
	virtualServiceYAML = `
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: onboarding-endpoint
  namespace: istio-system
spec:
  hosts: ["onboarding-endpoint.example.corp"]
  gateways: [vmgateway]
  tls:
  - match: [{port: 15443, sniHosts: ["onboarding-endpoint.example.corp"]}]
    route: [{destination: {host: onboarding-endpoint.istio-system.svc.cluster.local, port: {number: 15443}}}]
  - match: [{port: 15012, sniHosts: ["onboarding-endpoint.example.corp"]}]
    route: [{destination: {host: onboarding-endpoint.istio-system.svc.cluster.local, port: {number: 15012}}}]
`
	embarkServiceYAML = `
apiVersion: v1
kind: Service
metadata:
  name: onboarding-endpoint
  namespace: istio-system
spec:
  selector: {app: onboarding-endpoint}
  ports:
  - {name: tls-onboard, port: 15443, targetPort: 15443}
  - {name: tls-xds, port: 15012, targetPort: 15012}
`
)

// createAll creates the YAML objects into their typed forms and deletes
// them when the test ends.
func createAll(t *testing.T, objs map[string]client.Object) {
	t.Helper()
	for doc, obj := range objs {
		if err := yaml.Unmarshal([]byte(doc), obj); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Create(t.Context(), obj); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}
}

// The east-west gateway, as an xDS client of istiod (a router with the
// gateway's node metadata), gets what carries a VM's mesh traffic to the
// pods: a 15443 listener that reads the SNI and a cluster per Service port
// named by that SNI (sni-dnat), whose endpoints are the pods' own
// addresses; and what carries the VM's onboarding and xDS to Embark: filter
// chains for the endpoint's DNS name on 15443 and 15012 to Embark's Service.
func TestEastWestGatewayPassesVMTrafficToPodsAndEmbark(t *testing.T) {
	setMeshNetworks(t, "")
	createAll(t, map[string]client.Object{
		gatewayYAML: &istionetworkingv1.Gateway{}, virtualServiceYAML: &istionetworkingv1.VirtualService{}, embarkServiceYAML: &corev1.Service{},
	})
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
