package istiod

import (
	"context"
	"fmt"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/apimachinery/pkg/types"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry/nodeid"
	"github.com/embark-mesh/embark/test/adsclient"
	"github.com/embark-mesh/embark/test/meshkit"
)

// podProxy is an in-mesh proxy of another workload (productpage) as istiod
// sees it: an ADS stream to istiod with a pod's node ID, subscribed to the
// endpoints of one cluster. It uses istiod's plaintext port, which
// authenticates nobody (tests only); the configuration served is the same.
type podProxy struct {
	st      *adsclient.SotW
	cluster string
	updates chan *endpointv3.ClusterLoadAssignment
	// ns is the pod's namespace, to subscribe again when istiod closes the
	// stream (its max connection age is short here).
	ns string
}

func startPodProxy(t *testing.T, ns, service string, port int) *podProxy {
	t.Helper()
	return startPodProxyFor(t, ns, fmt.Sprintf("outbound|%d||%s.%s.svc.cluster.local", port, service, ns))
}

// startPodProxyFor starts a pod's proxy in ns subscribed to the endpoints of
// cluster.
func startPodProxyFor(t *testing.T, ns, cluster string) *podProxy {
	t.Helper()
	conn, err := adsclient.Dial(istiod.GRPCAddr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	t.Cleanup(func() { cancel(); _ = conn.Close() })
	node := &core.Node{
		Id: nodeid.Build("10.244.0.9", types.NamespacedName{Namespace: ns, Name: "productpage-v1-5d9c8b7f6-x2v4k"}),
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			"CLUSTER_ID":    structpb.NewStringValue("Kubernetes"),
			"NAMESPACE":     structpb.NewStringValue(ns),
			"ISTIO_VERSION": structpb.NewStringValue("1.30.0"),
			"LABELS":        structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"app": structpb.NewStringValue("productpage")}}),
		}},
	}
	st, err := adsclient.OpenSotW(ctx, conn, "", node)
	if err != nil {
		t.Fatal(err)
	}
	p := &podProxy{st: st, cluster: cluster, updates: make(chan *endpointv3.ClusterLoadAssignment, 16), ns: ns}
	if err := st.Request(resource.EndpointType, p.cluster); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.updates)
		for {
			resp, err := st.Next()
			if err != nil {
				return
			}
			_ = st.ACK(resp)
			for _, r := range resp.GetResources() {
				cla := &endpointv3.ClusterLoadAssignment{}
				if r.UnmarshalTo(cla) == nil && cla.GetClusterName() == p.cluster {
					select {
					case p.updates <- cla:
					case <-ctx.Done():
						return
					}
				}
			}
		}
	}()
	return p
}

// vmEndpoint is what istiod serves about one address.
type vmEndpoint struct {
	healthy  bool
	locality string
	network  string
}

// endpointsOf returns the served endpoints by address.
func endpointsOf(cla *endpointv3.ClusterLoadAssignment) map[string]vmEndpoint {
	out := map[string]vmEndpoint{}
	for _, le := range cla.GetEndpoints() {
		loc := le.GetLocality()
		for _, lb := range le.GetLbEndpoints() {
			addr := lb.GetEndpoint().GetAddress().GetSocketAddress().GetAddress()
			network := lb.GetMetadata().GetFilterMetadata()["istio"].GetFields()["network"].GetStringValue()
			out[addr] = vmEndpoint{
				healthy:  lb.GetHealthStatus() == core.HealthStatus_HEALTHY || lb.GetHealthStatus() == core.HealthStatus_UNKNOWN,
				locality: loc.GetRegion() + "/" + loc.GetZone(),
				network:  network,
			}
		}
	}
	return out
}

// waitFor waits until the served endpoints satisfy ok.
func (p *podProxy) waitFor(t *testing.T, what string, ok func(map[string]vmEndpoint) bool) map[string]vmEndpoint {
	t.Helper()
	var last map[string]vmEndpoint
	timeout := time.After(60 * time.Second)
	for {
		select {
		case cla, open := <-p.updates:
			if !open {
				// istiod closed the stream (max connection age): the pod's
				// proxy connects again and gets the whole state first.
				*p = *startPodProxyFor(t, p.ns, p.cluster)
				continue
			}
			last = endpointsOf(cla)
			if ok(last) {
				return last
			}
		case <-timeout:
			t.Fatalf("istiod never served %s for %s; last %+v (istiod log:\n%s)", what, p.cluster, last, meshkit.Tail(istiod.Log()))
		}
	}
}

// A pod's proxy receives the VM as an endpoint of ratings, with its locality
// and network, only while it is healthy and registered.
func TestPodsRouteToHealthyRegisteredVMs(t *testing.T) {
	ns := env.Namespace(t)
	wg := ratingsGroup(t, ns)
	ep := startEndpoint(t, ns)
	vm := register(t, wg, 7)
	s := vm.connect(t, ep)
	s.reportHealth(t, true)
	waitHealthy(t, vm.Key, "True")

	pod := startPodProxy(t, ns, "ratings", 9080)
	healthyServed := func(m map[string]vmEndpoint) bool { e, ok := m[vm.IP]; return ok && e.healthy }
	got := pod.waitFor(t, "the healthy VM", healthyServed)[vm.IP]
	if got.locality != "us-east-2/us-east-2b" {
		t.Errorf("VM endpoint: locality %q, want us-east-2/us-east-2b", got.locality)
	}
	// This istiod carries no network in the endpoint's "istio" metadata on a
	// single-network mesh; the network it routes by is the entry's own.
	if we, err := getEntry(t, vm.Key); err != nil || we.Spec.Network != "virtual-machines" {
		t.Errorf("VM WorkloadEntry network: %v, %v; want virtual-machines", we, err)
	}

	s.reportHealth(t, false)
	waitHealthy(t, vm.Key, "False")
	pod.waitFor(t, "the unhealthy VM out of the endpoints", func(m map[string]vmEndpoint) bool { return !healthyServed(m) })
	s.reportHealth(t, true)
	pod.waitFor(t, "the VM back once healthy", healthyServed)

	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), vm.Key, war); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(t.Context(), war); err != nil {
		t.Fatal(err)
	}
	pod.waitFor(t, "the removed VM out of the endpoints", func(m map[string]vmEndpoint) bool { _, ok := m[vm.IP]; return !ok })
}
