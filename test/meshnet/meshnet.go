// Package meshnet declares a mesh of two networks in a test API server the
// way docs/multi-network.md says an operator does, for the tests with the
// real istiod (test/multinetwork) and the demo (test/demo):
//
//   - the pods' network as the topology.istio.io/network label of istiod's
//     namespace (LabelNamespace),
//   - its gateway as the vmgateway Service labelled with that network, with
//     the address a cloud's load-balancer controller writes in its status
//     (CreateGatewayService),
//   - the VM network's gateway in meshNetworks, the key of the istio
//     ConfigMap istiod reads (MeshNetworks, MeshNetworksConfigMap),
//   - a pod Service with one running, injected Pod and the EndpointSlice
//     Kubernetes writes for it (CreatePodService),
//
// and reads the network gateways istiod derived from them (Gateways, its
// /debug/networkz).
package meshnet

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The topology docs/multi-network.md describes.
const (
	// NetworkLabel is the label istiod reads a namespace's, a Pod's or a
	// gateway Service's network from.
	NetworkLabel = "topology.istio.io/network"
	// PodNetwork is the pods' network.
	PodNetwork = "kube-network"
	// VMNetwork is the VMs' network (a WorkloadGroup's
	// spec.template.network).
	VMNetwork = "virtual-machines"
	// GatewayPort is istiod's default network gateway port: a gateway
	// Service without a networking.istio.io/gatewayPort label must listen
	// on it.
	GatewayPort = 15443
	// GatewayServiceName is the gateway Service of the pods' network.
	GatewayServiceName = "vmgateway"
	// IstioConfigMap is the ConfigMap whose meshNetworks key istiod reads
	// when its --networksConfig file is absent.
	IstioConfigMap = "istio"
)

// LabelNamespace labels namespace ns with network (creating ns when it does
// not exist): istiod places the Pods of its own namespace's cluster on that
// network.
func LabelNamespace(ctx context.Context, c client.Client, ns, network string) error {
	obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	if apierrors.IsNotFound(err) {
		obj.Labels = map[string]string{NetworkLabel: network}
		if err := c.Create(ctx, obj); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("read namespace %s: %w", ns, err)
	}
	patch := client.MergeFrom(obj.DeepCopy())
	if obj.Labels == nil {
		obj.Labels = map[string]string{}
	}
	obj.Labels[NetworkLabel] = network
	if err := c.Patch(ctx, obj, patch); err != nil {
		return fmt.Errorf("label namespace %s: %w", ns, err)
	}
	return nil
}

// CreateGatewayService creates vmgateway in namespace ns as a multi-network
// install has it: a LoadBalancer Service of the east-west gateway's Pods,
// labelled with network, with ports 15443, 15012 and 15021, and addr as its
// load balancer's address in its status (what a cloud's controller
// writes): istiod's label discovery makes addr:15443 network's gateway.
func CreateGatewayService(ctx context.Context, c client.Client, ns, network, addr string) error {
	port := func(name string, p int32) corev1.ServicePort {
		return corev1.ServicePort{Name: name, Port: p, TargetPort: intstr.FromInt32(p), Protocol: corev1.ProtocolTCP}
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: GatewayServiceName, Namespace: ns, Labels: map[string]string{
			NetworkLabel: network, "istio": "eastwestgateway", "app": "istio-eastwestgateway",
		}},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"istio": "eastwestgateway"},
			Ports:    []corev1.ServicePort{port("tls", GatewayPort), port("tls-xds", 15012), port("status-port", 15021)},
		},
	}
	if err := c.Create(ctx, svc); err != nil {
		return fmt.Errorf("create the gateway Service: %w", err)
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: addr}}
	if err := c.Status().Update(ctx, svc); err != nil {
		return fmt.Errorf("set the gateway Service's load-balancer address: %w", err)
	}
	return nil
}

// MeshNetworks is the meshNetworks document that declares network's
// gateway at addr and port: the network's endpoints are those istiod
// places on it (fromRegistry names the network, as Istio's VM docs do).
func MeshNetworks(network, addr string, port int) string {
	return fmt.Sprintf("networks:\n  %s:\n    endpoints:\n    - fromRegistry: %s\n    gateways:\n    - address: %s\n      port: %d\n",
		network, network, addr, port)
}

// MeshNetworksConfigMap is the istio ConfigMap of namespace ns holding
// networks (a MeshNetworks document) under meshNetworks.
func MeshNetworksConfigMap(ns, networks string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: IstioConfigMap, Namespace: ns},
		Data:       map[string]string{"meshNetworks": networks},
	}
}

// PodService is a Service of pods on the pods' network: one running,
// ready Pod, injected (labelled security.istio.io/tlsMode=istio, as the
// sidecar injector labels it), selected by app=Name.
type PodService struct {
	Namespace, Name string
	// Port is the Service's port and the Pod's.
	Port int32
	// PodName and PodIP are the Pod's.
	PodName, PodIP string
}

// CreatePodService creates s's Service, its Pod (with the status the
// kubelet writes) and the EndpointSlice the EndpointSlice controller
// writes.
func CreatePodService(ctx context.Context, c client.Client, s PodService) error {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": s.Name},
		Ports:    []corev1.ServicePort{{Name: "http", Port: s.Port, TargetPort: intstr.FromInt32(s.Port)}},
	}}
	if err := c.Create(ctx, svc); err != nil {
		return fmt.Errorf("create Service %s: %w", s.Name, err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: s.PodName, Namespace: s.Namespace, Labels: map[string]string{
		"app": s.Name, "version": "v1", "security.istio.io/tlsMode": "istio",
	}}}
	pod.Spec.Containers = []corev1.Container{{Name: s.Name, Image: s.Name}}
	if err := c.Create(ctx, pod); err != nil {
		return fmt.Errorf("create Pod %s: %w", s.PodName, err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: s.PodIP, PodIPs: []corev1.PodIP{{IP: s.PodIP}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := c.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("set Pod %s running: %w", s.PodName, err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: s.Name + "-pods", Namespace: s.Namespace, Labels: map[string]string{discoveryv1.LabelServiceName: s.Name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(s.Port), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses: []string{s.PodIP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: s.PodName, Namespace: s.Namespace},
		}},
	}
	if err := c.Create(ctx, slice); err != nil {
		return fmt.Errorf("create the EndpointSlice of %s: %w", s.Name, err)
	}
	return nil
}

// Gateway is one "<network> <address>:<port>" as Gateway formats it.
func Gateway(network, addr string, port int) string {
	return network + " " + net.JoinHostPort(addr, strconv.Itoa(port))
}

// Gateways returns the network gateways istiod knows (its /debug/networkz
// on httpAddr), each as Gateway formats it, sorted.
func Gateways(ctx context.Context, httpAddr string) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/debug/networkz", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read istiod's network gateways: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("istiod's /debug/networkz: %s", resp.Status)
	}
	var gws []struct {
		Network, Addr string
		Port          uint32
	}
	if err := json.NewDecoder(resp.Body).Decode(&gws); err != nil {
		return nil, fmt.Errorf("decode istiod's /debug/networkz: %w", err)
	}
	out := make([]string, 0, len(gws))
	for _, g := range gws {
		out = append(out, Gateway(g.Network, g.Addr, int(g.Port)))
	}
	slices.Sort(out)
	return out, nil
}
