package manifests

import (
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/test/testenv"
)

// multiNetwork is the kustomize root of a VM on its own network with the
// IstioOperator overlay; eastWestGateway is its IstioOperator file.
const (
	multiNetwork    = "istio-operator-multi-network"
	eastWestGateway = "istio-operator-multi-network/eastwest-gateway.yaml"
)

// The multi-network wiring, from the chart (vmgateway.network) and from the
// IstioOperator overlay (istio-operator-multi-network), is accepted by a server-side dry
// run against the real API server (Istio's CRDs installed).
func TestMultiNetworkServerSideDryRun(t *testing.T) {
	createBookinfo(t)
	chartOut, chartObjs := renderChart(t, map[string]any{"vmgateway": map[string]any{"network": "kube-network"}})
	kustOut, kustObjs := build(t, multiNetwork)
	for name, in := range map[string]struct {
		out  []byte
		objs []*unstructured.Unstructured
	}{"chart": {chartOut, chartObjs}, multiNetwork: {kustOut, kustObjs}} {
		t.Run(name, func(t *testing.T) {
			got, err := env.Kubectl(t.Context(), in.out, "apply", "--server-side", "--force-conflicts", "--field-manager=embark-test",
				"--dry-run=server", "-f", "-")
			if err != nil {
				t.Fatal(err)
			}
			appliedAll(t, got, in.objs)
		})
	}
}

// The chart with vmgateway.network and istio-operator-multi-network wire
// the same gateway: vmgateway labelled with the pods' network, selecting the
// east-west gateway's Pods, with the same ports; the same Gateway servers
// and VirtualService routes. Embark's ClusterIP Service reaches the
// endpoint's onboarding and xDS ports in each layout (the chart's container
// ports, the overlay's in istiod's Pod).
func TestMultiNetworkChartMatchesOverlay(t *testing.T) {
	_, chart := renderChart(t, map[string]any{"vmgateway": map[string]any{"network": "kube-network"}})
	_, kust := build(t, multiNetwork)

	var chartGW, kustGW corev1.Service
	if err := into(mustFind(t, chart, "Service", "vmgateway"), &chartGW); err != nil {
		t.Fatal(err)
	}
	if err := into(mustFind(t, kust, "Service", "vmgateway"), &kustGW); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]corev1.Service{"chart": chartGW, multiNetwork: kustGW} {
		if got := s.Labels["topology.istio.io/network"]; got != "kube-network" {
			t.Errorf("%s: vmgateway network label %q, want kube-network", name, got)
		}
		if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
			t.Errorf("%s: vmgateway type %s, want LoadBalancer", name, s.Spec.Type)
		}
	}
	if !reflect.DeepEqual(chartGW.Spec.Selector, kustGW.Spec.Selector) || !reflect.DeepEqual(chartGW.Spec.Ports, kustGW.Spec.Ports) {
		t.Errorf("vmgateway differs:\nchart   %v %v\noverlay %v %v", chartGW.Spec.Selector, chartGW.Spec.Ports, kustGW.Spec.Selector, kustGW.Spec.Ports)
	}
	for _, kind := range []struct{ kind, name string }{{"Gateway", "vmgateway"}, {"VirtualService", "onboarding-endpoint"}} {
		c, k := mustFind(t, chart, kind.kind, kind.name).Object["spec"], mustFind(t, kust, kind.kind, kind.name).Object["spec"]
		if !reflect.DeepEqual(c, k) {
			cy, _ := sigsyaml.Marshal(c)
			ky, _ := sigsyaml.Marshal(k)
			t.Errorf("%s %s differs:\nchart:\n%s\noverlay:\n%s", kind.kind, kind.name, cy, ky)
		}
	}

	var chartEmbark, kustEmbark corev1.Service
	if err := into(mustFind(t, chart, "Service", "onboarding-endpoint"), &chartEmbark); err != nil {
		t.Fatal(err)
	}
	if err := into(mustFind(t, kust, "Service", "onboarding-endpoint"), &kustEmbark); err != nil {
		t.Fatal(err)
	}
	targets := func(s corev1.Service) map[int32]string {
		out := map[int32]string{}
		for _, p := range s.Spec.Ports {
			out[p.Port] = p.TargetPort.String()
		}
		return out
	}
	if got, want := targets(chartEmbark), map[int32]string{15443: "grpc-onboard", 15012: "grpc-xds"}; !reflect.DeepEqual(got, want) {
		t.Errorf("chart: Embark's Service targets %v, want %v (the container's named ports)", got, want)
	}
	if got, want := targets(kustEmbark), map[int32]string{15443: "15443", 15012: "15112"}; !reflect.DeepEqual(got, want) {
		t.Errorf("overlay: Embark's Service targets %v, want %v (the endpoint's ports in istiod's Pod)", got, want)
	}

	// The endpoint checks registrations against the network vmgateway is
	// labelled with; the overlay's configuration is ../istio-operator's
	// but for that.
	chartCfg := endpointConfig(t, mustFind(t, chart, "ConfigMap", "onboarding-endpoint"))
	kustCfg := endpointConfig(t, mustFind(t, kust, "ConfigMap", "onboarding-endpoint-istiod"))
	for name, cfg := range map[string]*config.Configuration{"chart": chartCfg, multiNetwork: kustCfg} {
		if cfg.Mesh.Network == nil || cfg.Mesh.Network.Pods != "kube-network" {
			t.Errorf("%s: mesh.network %+v, want pods: kube-network", name, cfg.Mesh.Network)
		}
	}
	_, single := build(t, "istio-operator")
	singleCfg := endpointConfig(t, mustFind(t, single, "ConfigMap", "onboarding-endpoint-istiod"))
	kustCfg.Mesh.Network = nil
	if !reflect.DeepEqual(kustCfg, singleCfg) {
		t.Errorf("%s's configuration differs from istio-operator's in more than mesh.network:\n%+v\n%+v", multiNetwork, kustCfg, singleCfg)
	}
}

// istioctl renders the overlay with eastwest-gateway.yaml into an east-west
// gateway whose Pods vmgateway selects, a router in sni-dnat mode routing
// within the network vmgateway is labelled with, behind a ClusterIP Service
// of its own (vmgateway is the one load balancer).
func TestMultiNetworkEastWestGateway(t *testing.T) {
	assets, err := testenv.AssetsDir("")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), filepath.Join(assets, "istioctl"), "manifest", "generate",
		"-f", "istio-operator/istio-operator.yaml", "-f", eastWestGateway)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("istioctl manifest generate: %v", err)
	}
	objs, err := decodeAll(out)
	if err != nil {
		t.Fatal(err)
	}
	_, kust := build(t, multiNetwork)
	var vmgateway corev1.Service
	if err := into(mustFind(t, kust, "Service", "vmgateway"), &vmgateway); err != nil {
		t.Fatal(err)
	}
	network := vmgateway.Labels["topology.istio.io/network"]

	var d appsv1.Deployment
	if err := into(mustFind(t, objs, "Deployment", "istio-eastwestgateway"), &d); err != nil {
		t.Fatal(err)
	}
	for k, v := range vmgateway.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("the east-west gateway's Pods lack %s=%s, which vmgateway selects; labels %v", k, v, d.Spec.Template.Labels)
		}
	}
	env := map[string]string{}
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
	}
	for k, want := range map[string]string{"ISTIO_META_ROUTER_MODE": "sni-dnat", "ISTIO_META_REQUESTED_NETWORK_VIEW": network, "ISTIO_META_NETWORK": network} {
		if env[k] != want {
			t.Errorf("east-west gateway %s=%q, want %q", k, env[k], want)
		}
	}
	var own corev1.Service
	if err := into(mustFind(t, objs, "Service", "istio-eastwestgateway"), &own); err != nil {
		t.Fatal(err)
	}
	if own.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("the east-west gateway's own Service is %s, want ClusterIP (vmgateway is the load balancer)", own.Spec.Type)
	}
	if _, labelled := own.Labels["topology.istio.io/network"]; labelled {
		t.Error("the east-west gateway's own Service carries the network label: istiod would see a second gateway of the network, with no address")
	}
}
