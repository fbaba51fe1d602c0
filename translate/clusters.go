package translate

import (
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strconv"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Annotations and conditions of WorkloadEntry health.
const (
	HealthChecksAnnotation = "proxy.istio.io/health-checks-enabled"
	HealthyCondition       = "Healthy"
)

// endpoint is one address of a destination, with the service account it
// runs as when known.
type endpoint struct {
	addr   string
	port   uint32
	weight uint32
	sa     string
}

// outboundCluster creates (once) the cluster of a destination, and its
// endpoints when it uses EDS. It returns the cluster name, or "" when the
// destination cannot be translated (a warning says why).
func (b *builder) outboundCluster(d destination) string {
	name := d.clusterName()
	if _, ok := b.clusters[name]; ok {
		return name
	}
	var (
		c    *clusterv3.Cluster
		eps  []endpoint
		mesh bool
	)
	switch {
	case d.svc != nil:
		eps = b.serviceEndpoints(d.svc, d.svcPort)
		mesh = true
	default:
		eps = b.serviceEntryEndpoints(d.se, d.sePort)
		mesh = d.se.Spec.GetLocation() == networkingv1alpha3.ServiceEntry_MESH_INTERNAL
	}
	resolution := networkingv1alpha3.ServiceEntry_STATIC
	if d.se != nil {
		resolution = d.se.Spec.GetResolution()
	}
	switch resolution {
	case networkingv1alpha3.ServiceEntry_DNS, networkingv1alpha3.ServiceEntry_DNS_ROUND_ROBIN:
		if len(d.se.Spec.GetEndpoints()) == 0 {
			if _, err := netip.ParseAddr(d.host); err == nil || !isDNSName(d.host) {
				b.warn("ServiceEntry %s/%s: host %q cannot be resolved by DNS; %s left out", d.se.Namespace, d.se.Name, d.host, name)
				return ""
			}
			target := d.port
			if d.sePort.GetTargetPort() != 0 {
				target = d.sePort.GetTargetPort()
			}
			eps = []endpoint{{addr: d.host, port: target}}
		} else {
			eps = b.inlineEndpoints(d.se, d.sePort)
		}
		if len(eps) == 0 {
			b.warn("ServiceEntry %s/%s: no endpoint has an address; %s left out", d.se.Namespace, d.se.Name, name)
			return ""
		}
		t := clusterv3.Cluster_STRICT_DNS
		if resolution == networkingv1alpha3.ServiceEntry_DNS_ROUND_ROBIN {
			t = clusterv3.Cluster_LOGICAL_DNS
			if len(eps) > 1 {
				eps = eps[:1]
			}
		}
		c = baseCluster(name, t)
		c.DnsLookupFamily = clusterv3.Cluster_V4_PREFERRED
		c.LoadAssignment = loadAssignment(name, eps)
	case networkingv1alpha3.ServiceEntry_DYNAMIC_DNS:
		b.warn("ServiceEntry %s/%s: resolution DYNAMIC_DNS is not supported; %s left out", d.se.Namespace, d.se.Name, name)
		return ""
	default: // STATIC, NONE and Services: EDS over ADS
		c = baseCluster(name, clusterv3.Cluster_EDS)
		c.EdsClusterConfig = &clusterv3.Cluster_EdsClusterConfig{EdsConfig: adsSource()}
		ipEps := eps[:0:0]
		for _, e := range eps {
			if _, err := parseIP(e.addr); err != nil {
				b.warn("%s: endpoint address %q is not an IP address; left out", name, e.addr)
				continue
			}
			ipEps = append(ipEps, e)
		}
		eps = ipEps
		b.endpoints[name] = loadAssignment(name, eps)
	}
	if d.proto.isHTTP2() {
		c.TypedExtensionProtocolOptions = http2Options()
	}
	if mesh {
		sni := fmt.Sprintf("outbound_.%d_._.%s", d.port, d.host)
		c.TransportSocket = outboundTLS(sni, b.sans(d, eps))
	}
	b.clusters[name] = c
	return name
}

// sans are the SPIFFE IDs the destination's endpoints may present: those of
// their service accounts plus a ServiceEntry's subjectAltNames. When an
// endpoint's service account is unknown (no Pods given, an entry without
// one) and the ServiceEntry names no subjectAltNames, any identity of the
// destination's namespace is accepted as well, so that endpoint is not
// locked out.
func (b *builder) sans(d destination, eps []endpoint) []*tlsv3.SubjectAltNameMatcher {
	set := map[string]bool{}
	unknown := len(eps) == 0
	for _, e := range eps {
		if e.sa != "" {
			set[b.spiffeID(d.ns, e.sa)] = true
		} else {
			unknown = true
		}
	}
	if d.se != nil && len(d.se.Spec.GetSubjectAltNames()) > 0 {
		unknown = false
		for _, s := range d.se.Spec.GetSubjectAltNames() {
			set[s] = true
		}
	}
	ids := make([]string, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	out := exactSANs(ids)
	if unknown {
		out = append(out, prefixSAN(fmt.Sprintf("spiffe://%s/ns/%s/", b.trust, d.ns))...)
	}
	return out
}

// SpiffeID is the identity of a service account: spiffe://<td>/ns/<ns>/sa/<sa>.
func (b *builder) spiffeID(ns, sa string) string {
	return fmt.Sprintf("spiffe://%s/ns/%s/sa/%s", b.trust, ns, sa)
}

func loadAssignment(name string, eps []endpoint) *endpointv3.ClusterLoadAssignment {
	sort.Slice(eps, func(i, j int) bool {
		if eps[i].addr != eps[j].addr {
			return eps[i].addr < eps[j].addr
		}
		return eps[i].port < eps[j].port
	})
	cla := &endpointv3.ClusterLoadAssignment{ClusterName: name}
	if len(eps) == 0 {
		return cla
	}
	loc := &endpointv3.LocalityLbEndpoints{}
	seen := map[string]bool{}
	for _, e := range eps {
		key := net.JoinHostPort(e.addr, strconv.Itoa(int(e.port)))
		if seen[key] {
			continue
		}
		seen[key] = true
		loc.LbEndpoints = append(loc.LbEndpoints, lbEndpoint(socketAddress(e.addr, e.port), e.weight))
	}
	cla.Endpoints = []*endpointv3.LocalityLbEndpoints{loc}
	return cla
}

// serviceEndpoints are the ready endpoints of the Service's EndpointSlices
// for the port (matched by name) plus the healthy WorkloadEntries of the
// Service's namespace its selector selects.
func (b *builder) serviceEndpoints(svc *corev1.Service, sp corev1.ServicePort) []endpoint {
	var out []endpoint
	for _, es := range b.slices[svc.Namespace+"/"+svc.Name] {
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
			ep := endpoint{addr: e.Addresses[0], port: port}
			if e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
				ns := e.TargetRef.Namespace
				if ns == "" {
					ns = es.Namespace
				}
				ep.sa = b.podSA[ns+"/"+e.TargetRef.Name]
			}
			out = append(out, ep)
		}
	}
	if len(svc.Spec.Selector) == 0 {
		return out
	}
	for _, we := range b.in.WorkloadEntries {
		if we == nil || we.Namespace != svc.Namespace || !labelsMatch(svc.Spec.Selector, we.Spec.GetLabels()) || !weHealthy(we) {
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
		out = append(out, endpoint{addr: we.Spec.GetAddress(), port: port, weight: we.Spec.GetWeight(), sa: we.Spec.GetServiceAccount()})
	}
	return out
}

// serviceEntryEndpoints are a ServiceEntry's inline endpoints plus the
// healthy WorkloadEntries of its namespace its workloadSelector selects.
func (b *builder) serviceEntryEndpoints(se *istionetworkingv1.ServiceEntry, sp *networkingv1alpha3.ServicePort) []endpoint {
	out := b.inlineEndpoints(se, sp)
	sel := se.Spec.GetWorkloadSelector().GetLabels()
	if len(sel) == 0 {
		return out
	}
	for _, we := range b.in.WorkloadEntries {
		if we == nil || we.Namespace != se.Namespace || !labelsMatch(sel, we.Spec.GetLabels()) || !weHealthy(we) {
			continue
		}
		out = append(out, endpoint{addr: we.Spec.GetAddress(), port: entryPort(&we.Spec, sp), weight: we.Spec.GetWeight(), sa: we.Spec.GetServiceAccount()})
	}
	// Pods are selected too (seed 003: VMs and pods load-balance together).
	for _, p := range b.in.Pods {
		if p == nil || p.Namespace != se.Namespace || !labelsMatch(sel, p.Labels) || !podReady(p) {
			continue
		}
		sa := p.Spec.ServiceAccountName
		if sa == "" {
			sa = "default"
		}
		port := sp.GetNumber()
		if sp.GetTargetPort() != 0 {
			port = sp.GetTargetPort()
		}
		out = append(out, endpoint{addr: p.Status.PodIP, port: port, sa: sa})
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

func (b *builder) inlineEndpoints(se *istionetworkingv1.ServiceEntry, sp *networkingv1alpha3.ServicePort) []endpoint {
	var out []endpoint
	for _, we := range se.Spec.GetEndpoints() {
		if we.GetAddress() == "" {
			continue
		}
		out = append(out, endpoint{addr: we.GetAddress(), port: entryPort(we, sp), weight: we.GetWeight(), sa: we.GetServiceAccount()})
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

// weHealthy leaves out WorkloadEntries whose Healthy condition is False,
// and those with health checks enabled that have not reported Healthy=True
// yet (Istio counts them unhealthy until the first success).
func weHealthy(we *istionetworkingv1.WorkloadEntry) bool {
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

func isDNSName(h string) bool {
	_, err := ParseHostForm("*/" + h)
	return err == nil && h != "*" && h[0] != '*'
}
