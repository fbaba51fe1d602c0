// Package endpoints lists the endpoints of a Service or ServiceEntry port
// as istiod does, with the service account each runs as when known: the
// ready endpoints of a Service's EndpointSlices (their pods' service
// accounts), a ServiceEntry's inline endpoints, and the healthy
// WorkloadEntries and ready pods a Service or ServiceEntry selects (seed
// 003: VMs and pods load-balance together); and turns them into a cluster
// load assignment.
package endpoints

import (
	"cmp"
	"fmt"
	"slices"
	"sync"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/embark-mesh/embark/translate/internal/envoyconf"
	"github.com/embark-mesh/embark/translate/selection"
)

// Index holds the objects endpoints are read from, indexed once. It may be
// reused by every translation while those objects do not change (a
// Sidecar or Service change leaves it valid): it remembers the endpoints
// of each Service and ServiceEntry port it was asked for (by the object's
// resourceVersion), so the WorkloadEntries and pods are scanned once per
// port, not once per translation. Safe for concurrent use.
type Index struct {
	workloadEntries []*istionetworkingv1.WorkloadEntry
	pods            []*corev1.Pod
	// podSA maps "<namespace>/<pod>" to the pod's service account.
	podSA map[string]string
	// slices maps "<namespace>/<service>" to the Service's EndpointSlices.
	slices map[string][]*discoveryv1.EndpointSlice

	mu sync.Mutex
	// ofService and ofEntry remember the endpoints by the object's
	// identity and resourceVersion (equal resourceVersions, equal
	// objects; a changed object is a new key) and the port asked for.
	// Objects without a resourceVersion are not remembered.
	ofService map[portKey][]Endpoint
	ofEntry   map[portKey][]Endpoint
}

// portKey names one port of one version of a Service or ServiceEntry.
type portKey struct {
	uid             types.UID
	namespace, name string
	resourceVersion string
	port            string // the port as asked for, see keyOf
}

// keyOf is the key of obj's port, ok false when obj has no resourceVersion.
func keyOf(obj metav1.Object, port string) (portKey, bool) {
	if obj.GetResourceVersion() == "" {
		return portKey{}, false
	}
	return portKey{obj.GetUID(), obj.GetNamespace(), obj.GetName(), obj.GetResourceVersion(), port}, true
}

// remembered returns m's endpoints for k, computing them once.
func (x *Index) remembered(m map[portKey][]Endpoint, k portKey, ok bool, compute func() []Endpoint) []Endpoint {
	if !ok {
		return compute()
	}
	x.mu.Lock()
	eps, found := m[k]
	x.mu.Unlock()
	if !found {
		eps = compute()
		x.mu.Lock()
		m[k] = eps
		x.mu.Unlock()
	}
	return slices.Clone(eps)
}

// NewIndex indexes the EndpointSlices by Service and the pods' service
// accounts. The slices are not modified; nil entries are skipped.
func NewIndex(slices []*discoveryv1.EndpointSlice, pods []*corev1.Pod, wes []*istionetworkingv1.WorkloadEntry) *Index {
	x := &Index{workloadEntries: wes, pods: pods, podSA: map[string]string{}, slices: map[string][]*discoveryv1.EndpointSlice{},
		ofService: map[portKey][]Endpoint{}, ofEntry: map[portKey][]Endpoint{}}
	for _, es := range slices {
		if es != nil && es.Labels[discoveryv1.LabelServiceName] != "" {
			key := es.Namespace + "/" + es.Labels[discoveryv1.LabelServiceName]
			x.slices[key] = append(x.slices[key], es)
		}
	}
	for _, p := range pods {
		if p != nil {
			x.podSA[p.Namespace+"/"+p.Name] = serviceAccount(p)
		}
	}
	return x
}

// serviceAccount is the pod's service account ("default" when unset).
func serviceAccount(p *corev1.Pod) string {
	if p.Spec.ServiceAccountName == "" {
		return "default"
	}
	return p.Spec.ServiceAccountName
}

// Annotations and conditions of WorkloadEntry health.
const (
	HealthChecksAnnotation = "proxy.istio.io/health-checks-enabled"
	HealthyCondition       = "Healthy"
)

// Endpoint is one address of a destination, with the service account it
// runs as when known.
type Endpoint struct {
	Addr   string
	Port   uint32
	Weight uint32
	SA     string
}

// LoadAssignment is the cluster load assignment of eps, sorted by address
// and port, without duplicates (of one address and port, the one with the
// lowest weight, then service account, is kept); eps is sorted in place.
func LoadAssignment(name string, eps []Endpoint) *endpointv3.ClusterLoadAssignment {
	slices.SortFunc(eps, func(a, b Endpoint) int {
		return cmp.Or(cmp.Compare(a.Addr, b.Addr), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Weight, b.Weight), cmp.Compare(a.SA, b.SA))
	})
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	if len(eps) == 0 {
		return cla
	}
	loc := &endpointv3.LocalityLbEndpoints{LbEndpoints: make([]*endpointv3.LbEndpoint, 0, len(eps))}
	for i, e := range eps {
		if i > 0 && e.Addr == eps[i-1].Addr && e.Port == eps[i-1].Port {
			continue // sorted: duplicates are adjacent
		}
		loc.LbEndpoints = append(loc.LbEndpoints, envoyconf.LBEndpoint(envoyconf.SocketAddress(e.Addr, e.Port), e.Weight))
	}
	cla.Endpoints = []*endpointv3.LocalityLbEndpoints{loc}
	return cla
}

// OfService are the ready endpoints of the Service's EndpointSlices
// for the port (matched by name) plus the healthy WorkloadEntries of the
// Service's namespace its selector selects. The slice is the caller's.
func (x *Index) OfService(svc *corev1.Service, sp corev1.ServicePort) []Endpoint {
	k, ok := keyOf(svc, fmt.Sprintf("%s|%d|%s|%s", sp.Name, sp.Port, sp.TargetPort.String(), sp.Protocol))
	return x.remembered(x.ofService, k, ok, func() []Endpoint { return x.ofServiceUncached(svc, sp) })
}

func (x *Index) ofServiceUncached(svc *corev1.Service, sp corev1.ServicePort) []Endpoint {
	var out []Endpoint
	for _, es := range x.slices[svc.Namespace+"/"+svc.Name] {
		if es.AddressType != discoveryv1.AddressTypeIPv4 && es.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		var port uint32
		for _, p := range es.Ports {
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			if name == sp.Name && (p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP) && p.Port != nil {
				port = uint32(*p.Port)
				break
			}
		}
		if port == 0 {
			continue
		}
		for _, e := range es.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			if len(e.Addresses) == 0 {
				continue
			}
			ep := Endpoint{Addr: e.Addresses[0], Port: port}
			if e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
				ns := e.TargetRef.Namespace
				if ns == "" {
					ns = es.Namespace
				}
				ep.SA = x.podSA[ns+"/"+e.TargetRef.Name]
			}
			out = append(out, ep)
		}
	}
	if len(svc.Spec.Selector) == 0 {
		return out
	}
	for _, we := range x.workloadEntries {
		if we == nil || we.Namespace != svc.Namespace || !selection.LabelsMatch(svc.Spec.Selector, we.Spec.GetLabels()) || !Healthy(we) {
			continue
		}
		port := uint32(sp.Port)
		switch {
		case we.Spec.GetPorts()[sp.Name] != 0:
			port = we.Spec.GetPorts()[sp.Name]
		case sp.TargetPort.IntVal != 0:
			port = uint32(sp.TargetPort.IntVal)
		case sp.TargetPort.StrVal != "" && we.Spec.GetPorts()[sp.TargetPort.StrVal] != 0:
			port = we.Spec.GetPorts()[sp.TargetPort.StrVal]
		}
		out = append(out, Endpoint{Addr: we.Spec.GetAddress(), Port: port, Weight: we.Spec.GetWeight(), SA: we.Spec.GetServiceAccount()})
	}
	return out
}

// OfServiceEntry are a ServiceEntry's inline endpoints plus the
// healthy WorkloadEntries of its namespace its workloadSelector selects.
// The slice is the caller's.
func (x *Index) OfServiceEntry(se *istionetworkingv1.ServiceEntry, sp *networkingv1alpha3.ServicePort) []Endpoint {
	k, ok := keyOf(se, fmt.Sprintf("%s|%d|%d|%s", sp.GetName(), sp.GetNumber(), sp.GetTargetPort(), sp.GetProtocol()))
	return x.remembered(x.ofEntry, k, ok, func() []Endpoint { return x.ofServiceEntryUncached(se, sp) })
}

func (x *Index) ofServiceEntryUncached(se *istionetworkingv1.ServiceEntry, sp *networkingv1alpha3.ServicePort) []Endpoint {
	out := Inline(se, sp)
	sel := se.Spec.GetWorkloadSelector().GetLabels()
	if len(sel) == 0 {
		return out
	}
	for _, we := range x.workloadEntries {
		if we == nil || we.Namespace != se.Namespace || !selection.LabelsMatch(sel, we.Spec.GetLabels()) || !Healthy(we) {
			continue
		}
		out = append(out, Endpoint{Addr: we.Spec.GetAddress(), Port: entryPort(&we.Spec, sp), Weight: we.Spec.GetWeight(), SA: we.Spec.GetServiceAccount()})
	}
	// Pods are selected too: VMs and pods of a Service load-balance together.
	for _, p := range x.pods {
		if p == nil || p.Namespace != se.Namespace || !selection.LabelsMatch(sel, p.Labels) || !podReady(p) {
			continue
		}
		port := sp.GetNumber()
		if sp.GetTargetPort() != 0 {
			port = sp.GetTargetPort()
		}
		out = append(out, Endpoint{Addr: p.Status.PodIP, Port: port, SA: serviceAccount(p)})
	}
	return out
}

// podReady reports a running pod with an IP whose Ready condition is True.
func podReady(p *corev1.Pod) bool {
	if p.Status.PodIP == "" || p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Inline are a ServiceEntry's own endpoints (those with an address).
func Inline(se *istionetworkingv1.ServiceEntry, sp *networkingv1alpha3.ServicePort) []Endpoint {
	var out []Endpoint
	for _, we := range se.Spec.GetEndpoints() {
		if we.GetAddress() == "" {
			continue
		}
		out = append(out, Endpoint{Addr: we.GetAddress(), Port: entryPort(we, sp), Weight: we.GetWeight(), SA: we.GetServiceAccount()})
	}
	return out
}

func entryPort(we *networkingv1alpha3.WorkloadEntry, sp *networkingv1alpha3.ServicePort) uint32 {
	if p := we.GetPorts()[sp.GetName()]; p != 0 {
		return p
	}
	if sp.GetTargetPort() != 0 {
		return sp.GetTargetPort()
	}
	return sp.GetNumber()
}

// Healthy leaves out WorkloadEntries whose Healthy condition is False,
// and those with health checks enabled that have not reported Healthy=True
// yet (Istio counts them unhealthy until the first success).
func Healthy(we *istionetworkingv1.WorkloadEntry) bool {
	status := ""
	for _, c := range we.Status.GetConditions() {
		if c.GetType() == HealthyCondition {
			status = c.GetStatus()
		}
	}
	if status == "False" {
		return false
	}
	if we.Annotations[HealthChecksAnnotation] == "true" && status != "True" {
		return false
	}
	return true
}
