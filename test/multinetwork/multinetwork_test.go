package multinetwork

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/meshnet"
	"github.com/embark-mesh/embark/test/testenv"
)

// The VM's sidecar, relayed through Embark to istiod, gets a pod Service's
// endpoints as the pods' network gateway (vmgateway's load-balancer address
// and 15443), never the pod's own address; a pod's proxy on the pods'
// network gets the same Service as the pod's address.
func TestVMSidecarGetsPodServiceThroughTheGateway(t *testing.T) {
	setMeshNetworks(t, "")
	ns := env.Namespace(t)
	podIP := "10.244.1.15"
	productpage(t, ns, podIP)
	wg := ratingsGroup(t, ns)
	ep := startEndpoint(t, ns)
	vm := register(t, wg, 11)

	cluster := outbound(ns, "productpage", 9080)
	sidecar := vm.vmSidecar(t, ep)
	sidecar.subscribe(t, resource.EndpointType, cluster)
	gw := net.JoinHostPort(gatewayAddr, strconv.Itoa(gatewayPort))
	sidecar.waitEndpoints(t, cluster, gw)
	if addr := net.JoinHostPort(podIP, "9080"); sidecar.everServed(cluster, addr) {
		t.Errorf("the VM's sidecar was sent the pod's own address %s, which it cannot reach", addr)
	}

	pod := podProxy(t, ns)
	pod.subscribe(t, resource.EndpointType, cluster)
	pod.waitEndpoints(t, cluster, net.JoinHostPort(podIP, "9080"))
}

// A pod's proxy gets the VM's Service (ratings) as Istio's split-horizon
// rules give it: through the VM network's gateway when meshNetworks declares
// one; without one the pinned istiod treats the VM network as reachable and
// sends the VM's own address (docs/multi-network.md says so).
func TestPodGetsVMServiceByTheVMNetworksGateway(t *testing.T) {
	for _, tc := range []struct {
		name         string
		meshNetworks string
		want         func(vmIP string) string
	}{
		{
			name: "no gateway for the VM network: the VM's own address",
			want: func(vmIP string) string { return net.JoinHostPort(vmIP, "9080") },
		},
		{
			name:         "meshNetworks declares the VM network's gateway: its address and port",
			meshNetworks: meshnet.MeshNetworks(vmNetwork, "198.51.100.20", gatewayPort),
			want:         func(string) string { return "198.51.100.20:15443" },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setMeshNetworks(t, tc.meshNetworks)
			ns := env.Namespace(t)
			wg := ratingsGroup(t, ns)
			ep := startEndpoint(t, ns)
			vm := register(t, wg, 12)
			vm.vmSidecar(t, ep).subscribe(t, resource.ListenerType)

			cluster := outbound(ns, "ratings", 9080)
			pod := podProxy(t, ns)
			pod.subscribe(t, resource.EndpointType, cluster)
			pod.waitEndpoints(t, cluster, tc.want(vm.IP))
			if tc.meshNetworks != "" && pod.everServed(cluster, net.JoinHostPort(vm.IP, "9080")) {
				t.Errorf("a pod was sent the VM's own address %s although its network has a gateway", vm.IP)
			}
		})
	}
}

// setMeshNetworks writes meshNetworks into the istio ConfigMap istiod reads
// it from (its --networksConfig file is absent) and removes it when the test
// ends.
func setMeshNetworks(t *testing.T, networks string) {
	t.Helper()
	cm := meshnet.MeshNetworksConfigMap(testenv.IstiodNamespace, networks)
	_ = env.Client.Delete(t.Context(), cm)
	want := []string{meshnet.Gateway(podNetwork, gatewayAddr, gatewayPort)}
	if networks != "" {
		if err := env.Client.Create(t.Context(), cm); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), cm) })
		want = append(want, meshnet.Gateway(vmNetwork, "198.51.100.20", gatewayPort))
	}
	waitGateways(t, want...)
}

// waitGateways waits until istiod's network gateways are exactly want, each
// as meshnet.Gateway formats it.
func waitGateways(t *testing.T, want ...string) {
	t.Helper()
	slices.Sort(want)
	fixtures.Eventually(t, 30*time.Second, fmt.Sprintf("istiod's network gateways %v", want), func() bool {
		got, err := meshnet.Gateways(t.Context(), istiod.HTTPAddr)
		return err == nil && slices.Equal(got, want)
	})
}
