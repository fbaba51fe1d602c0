package translate

import (
	"crypto/sha256"
	"net"
	"sort"
	"strconv"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/embark-mesh/embark/translate/internal/envoyconf"
	"github.com/embark-mesh/embark/translate/selection"
)

// ScopeKey identifies the workloads whose configurations, for the same
// Inputs apart from the Workload, differ only in the workload's address and
// name: the workload's namespace and the label-selected objects that select
// it (Sidecars and PeerAuthentications of its namespace with a
// workloadSelector, AuthorizationPolicies and RequestAuthentications of its
// namespace or the root namespace). Every other field of Inputs is read the
// same way for every workload. Workloads with equal keys can share one
// Prepare; Shared.For adds what is each one's own.
func ScopeKey(in *Inputs) string {
	w := in.Workload
	root := in.RootNamespace
	if root == "" {
		root = DefaultRootNamespace
	}
	var sel []string
	for _, sc := range in.Sidecars {
		if sc == nil || sc.Namespace != w.Namespace {
			continue
		}
		if s := sc.Spec.GetWorkloadSelector().GetLabels(); len(s) > 0 && labelsMatch(s, w.Labels) {
			sel = append(sel, "Sidecar/"+sc.Name)
		}
	}
	for _, pa := range in.PeerAuthentications {
		if pa == nil || pa.Namespace != w.Namespace {
			continue
		}
		if s := pa.Spec.GetSelector().GetMatchLabels(); len(s) > 0 && labelsMatch(s, w.Labels) {
			sel = append(sel, "PeerAuthentication/"+pa.Name)
		}
	}
	for _, ra := range in.RequestAuthentications {
		if ra != nil && appliesTo(ra.Namespace, ra.Spec.GetSelector().GetMatchLabels(), false, w, root) {
			sel = append(sel, "RequestAuthentication/"+ra.Namespace+"/"+ra.Name)
		}
	}
	for _, ap := range in.AuthorizationPolicies {
		if ap != nil && appliesTo(ap.Namespace, ap.Spec.GetSelector().GetMatchLabels(), false, w, root) {
			sel = append(sel, "AuthorizationPolicy/"+ap.Namespace+"/"+ap.Name)
		}
	}
	if bindsPortlessEgress(in.Sidecars, w.Address) {
		// An egress listener without a port on the workload's own address
		// yields to its ingress listeners (see Prepare): the scope is the
		// address's alone.
		sel = append(sel, "Address/"+w.Address)
	}
	sort.Strings(sel)
	return w.Namespace + "|" + strings.Join(sel, ",")
}

// bindsPortlessEgress says whether an egress listener without a port of
// sidecars binds to addr.
func bindsPortlessEgress(sidecars []*istionetworkingv1.Sidecar, addr string) bool {
	for _, sc := range sidecars {
		for _, eg := range sc.Spec.GetEgress() {
			if eg.GetPort() != nil {
				continue
			}
			bind := eg.GetBind()
			if bind == "" {
				bind = DefaultEgressBind
			}
			if bind == addr {
				return true
			}
		}
	}
	return false
}

// Shared is the translation of one scope (see ScopeKey): everything but the
// ingress listeners and inbound clusters, which bind to each workload's own
// address. Prepare it once per scope and change of the inputs, then call For
// for each workload of the scope. It is not modified after Prepare and is
// safe for concurrent use; its resources are shared by every Result For
// returns and must not be modified.
type Shared struct {
	in     Inputs
	root   string
	trust  string
	suffix string
	authz  *authz
	// sidecar is the selected Sidecar (nil: none, the result is empty).
	sidecar *istionetworkingv1.Sidecar
	// common are the egress resources and the warnings, sorted.
	common Result
	// claims are the egress listeners' "<ip>:<port>" in the order egress
	// claimed them (the failing claim included), to check against each
	// workload's ingress listeners as one translation would.
	claims []claimed
	// err is egress's own error, returned after the claims are checked.
	err error
	// chains are the ingress listeners' filter chains, built once for the
	// scope: every workload's ingress listener on a port shares them.
	chains map[inboundChainKey][]*listenerv3.FilterChain
	// inbound are the other workload-independent parts of the ingress
	// listeners and inbound clusters, built once for the scope.
	inbound *inboundParts
	// ownInputs is the part of OwnInputs every workload shares
	// (ownInputsOK: it could be taken).
	ownInputs   [sha256.Size]byte
	ownInputsOK bool
}

// inboundChainKey is what an ingress listener's filter chains depend on.
type inboundChainKey struct {
	proto protocol
	port  uint32
	mode  MTLSMode
}

// claimed is one "<ip>:<port>" an egress listener claimed, and its field.
type claimed struct {
	key, field string
	// ip and port are key's parts.
	ip   string
	port uint32
}

// Prepare translates the scope of in's workload. It never fails: a
// translation error is returned by For, in the order Translate would
// return it (ingress errors first).
func Prepare(in *Inputs) *Shared {
	if in == nil {
		in = &Inputs{}
	}
	b := newBuilder(in)
	s := &Shared{in: *in, root: b.root, trust: b.trust, suffix: b.suffix, authz: b.authz}
	s.sidecar = selectSidecar(in.Sidecars, in.Workload, b.root)
	s.common = Result{Sidecar: s.sidecar, Unenforced: b.authz.unenforced}
	defer func() { s.ownInputs, s.ownInputsOK = s.ownInputsDigest() }()
	if s.sidecar == nil {
		return s
	}
	b.sidecarName = s.sidecar.Namespace + "/" + s.sidecar.Name
	s.chains = prepareChains(b, s.sidecar)
	s.inbound = prepareInbound(b, s.sidecar)
	b.claimIngress(s.sidecar)
	b.record = &s.claims
	b.warnIgnored(s.sidecar)
	s.err = b.egress(s.sidecar)
	b.finish(&s.common)
	return s
}

// claimIngress claims, before egress does, the addresses of sc's valid
// ingress listeners that are the same for every workload of the scope (an
// explicit bind) and, when an egress listener without a port binds to the
// workload's own address (which ScopeKey then makes the scope's alone),
// the ones on that address: egress listeners without a port leave out the
// ports ingress listeners took, as in Translate, where ingress claims first.
// For claims each workload's own again.
func (b *builder) claimIngress(sc *istionetworkingv1.Sidecar) {
	ownAddress := bindsPortlessEgress([]*istionetworkingv1.Sidecar{sc}, b.in.Workload.Address)
	for i, ing := range sc.Spec.GetIngress() {
		port := ing.GetPort().GetNumber()
		if _, ok := parseProtocol(ing.GetPort().GetProtocol()); !ok || port == 0 || port > 65535 {
			continue // For fails
		}
		bind := ing.GetBind()
		if bind == "" && ownAddress {
			bind = b.in.Workload.Address
		}
		if _, err := parseIP(bind); err != nil {
			continue
		}
		_ = b.claim(bind, port, "spec.ingress["+strconv.Itoa(i)+"]")
	}
}

// prepareChains builds the filter chains of sc's valid ingress listeners:
// what they depend on (protocol, port, the PeerAuthentication mode and the
// authorization of the workload's scope) is the same for every workload of
// the scope. The ones of invalid listeners are left to For, which fails.
func prepareChains(b *builder, sc *istionetworkingv1.Sidecar) map[inboundChainKey][]*listenerv3.FilterChain {
	out := map[inboundChainKey][]*listenerv3.FilterChain{}
	for _, ing := range sc.Spec.GetIngress() {
		port := ing.GetPort().GetNumber()
		proto, ok := parseProtocol(ing.GetPort().GetProtocol())
		if !ok || port == 0 || port > 65535 {
			continue
		}
		k := inboundChainKey{proto, port, selection.PeerAuthMode(b.in.PeerAuthentications, b.in.Workload.Namespace, b.in.Workload.Labels, b.root, port)}
		if _, done := out[k]; !done {
			out[k] = b.inboundChains(k.proto, k.port, k.mode)
		}
	}
	return out
}

// Parts are the messages the workloads' own resources share: the ingress
// listeners' filter chains and the inbound clusters that do not depend on
// the workload. The results of For hold these very objects (not copies),
// so a caller may hash or check them once per scope. They must not be
// modified.
func (s *Shared) Parts() (chains []*listenerv3.FilterChain, clusters []*clusterv3.Cluster) {
	for _, c := range s.chains {
		chains = append(chains, c...)
	}
	if s.inbound != nil {
		for _, c := range s.inbound.clusters {
			if c != nil {
				clusters = append(clusters, c)
			}
		}
	}
	return chains, clusters
}

// prepareInbound builds the workload-independent parts of sc's ingress
// listeners: the TLS inspector and the inbound clusters of the valid
// ingress listeners whose defaultEndpoint is not the workload's own
// address. The others are left to For (which fails on invalid ones).
func prepareInbound(b *builder, sc *istionetworkingv1.Sidecar) *inboundParts {
	p := &inboundParts{tlsInspector: envoyconf.TLSInspector()}
	for i, ing := range sc.Spec.GetIngress() {
		port := ing.GetPort().GetNumber()
		proto, ok := parseProtocol(ing.GetPort().GetProtocol())
		if !ok || port == 0 || port > 65535 || namesWorkloadAddress(ing.GetDefaultEndpoint()) {
			continue
		}
		c, err := b.inboundCluster(ing, proto)
		if err != nil {
			continue
		}
		if p.clusters == nil {
			p.clusters = make([]*clusterv3.Cluster, len(sc.Spec.GetIngress()))
		}
		p.clusters[i] = c
	}
	return p
}

// namesWorkloadAddress says whether the defaultEndpoint s stands for the
// workload's own address (an unspecified IP, see defaultEndpoint); true
// for one that does not parse, which For reports.
func namesWorkloadAddress(s string) bool {
	if strings.HasPrefix(s, "unix://") {
		return false
	}
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		return true
	}
	ip, err := parseIP(host)
	return err != nil || ip.IsUnspecified()
}

// Common is the part of every workload's configuration that is the same
// across the scope (nil when the scope's translation fails): its Sidecar,
// egress listeners, routes, outbound clusters, endpoints, warnings and
// unenforced policies.
func (s *Shared) Common() *Result {
	if s.err != nil {
		return nil
	}
	return &s.common
}

// For returns w's configuration, equal to Translate of the Inputs Prepare
// was given with w as their Workload, provided ScopeKey gives w the same key
// (its namespace and the objects selecting it are the same). own are the
// resources of the result that are w's alone (ingress listeners and inbound
// clusters, in a Result of their own); every other resource is Common's.
func (s *Shared) For(w Workload) (res, own *Result, err error) {
	if s.sidecar == nil {
		return &Result{Unenforced: s.common.Unenforced}, &Result{}, nil
	}
	in := s.in
	in.Workload = w
	b := &builder{
		in: &in, root: s.root, trust: s.trust, suffix: s.suffix, authz: s.authz,
		sidecarName: s.sidecar.Namespace + "/" + s.sidecar.Name,
		listeners:   map[string]*listenerv3.Listener{},
		clusters:    map[string]*clusterv3.Cluster{},
		routes:      map[string]*routev3.RouteConfiguration{},
		endpoints:   map[string]*endpointv3.ClusterLoadAssignment{},
		bound:       map[string]string{},
		chains:      s.chains,
		inbound:     s.inbound,
	}
	if err := b.ingress(s.sidecar); err != nil {
		return nil, nil, err
	}
	for _, c := range s.claims {
		if prev, ok := b.bound[c.key]; ok {
			return nil, nil, b.fail(c.field, "%s is already used by %s", c.key, prev)
		}
	}
	if s.err != nil {
		return nil, nil, s.err
	}
	var mine Result
	b.finish(&mine)
	res = &Result{
		Sidecar:    s.common.Sidecar,
		Listeners:  mergeByName(s.common.Listeners, mine.Listeners),
		Routes:     s.common.Routes,
		Clusters:   mergeByName(s.common.Clusters, mine.Clusters),
		Endpoints:  s.common.Endpoints,
		Warnings:   s.common.Warnings,
		Unenforced: s.common.Unenforced,
	}
	return res, &Result{Listeners: mine.Listeners, Clusters: mine.Clusters}, nil
}

// mergeByName merges two lists sorted by resource name (names are unique
// across them) into one sorted list; common is not modified.
func mergeByName(common, own []types.Resource) []types.Resource {
	if len(own) == 0 {
		return common
	}
	out := make([]types.Resource, 0, len(common)+len(own))
	i, j := 0, 0
	for i < len(common) && j < len(own) {
		if resourceName(common[i]) < resourceName(own[j]) {
			out = append(out, common[i])
			i++
		} else {
			out = append(out, own[j])
			j++
		}
	}
	out = append(out, common[i:]...)
	return append(out, own[j:]...)
}
