// Package rbac translates the Istio AuthorizationPolicies that select a
// workload into the Envoy RBAC filters of its inbound chains: the ALLOW and
// DENY subset of docs/translate.md ("Authorization") as RBAC network
// filters (TCP chains) and HTTP filters (HTTP chains). A policy that applies
// but cannot be enforced, and any RequestAuthentication that applies, make
// every chain refuse all traffic (fail closed), and are returned as
// UnenforcedPolicy for the caller to report.
package rbac

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	httprbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netrbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	securityv1beta1 "istio.io/api/security/v1beta1"
	istiosecurityv1 "istio.io/client-go/pkg/apis/security/v1"

	"github.com/embark-mesh/embark/translate/internal/envoyconf"
)

// Kinds of the policies translation reads for inbound enforcement.
const (
	KindAuthorizationPolicy   = "AuthorizationPolicy"
	KindRequestAuthentication = "RequestAuthentication"
)

// UnenforcedPolicy is a policy that applies to the workload but that
// standalone translation cannot enforce. When a Result has any, every
// inbound filter chain refuses all traffic (fail closed).
type UnenforcedPolicy struct {
	// Kind is AuthorizationPolicy or RequestAuthentication.
	Kind string
	// Namespace and Name of the policy.
	Namespace, Name string
	// Reason says what of it is not enforced, e.g. "spec.rules[0].when is
	// not translated".
	Reason string
}

func (u UnenforcedPolicy) String() string {
	return fmt.Sprintf("%s %s/%s: %s", u.Kind, u.Namespace, u.Name, u.Reason)
}

// Authorization is the inbound authorization of a workload: the RBAC rules
// of the AuthorizationPolicies that select it, or refuse-all when a policy
// selecting it cannot be enforced.
type Authorization struct {
	policies   []*istiosecurityv1.AuthorizationPolicy // ALLOW and DENY, sorted
	unenforced []UnenforcedPolicy
}

// AppliesFunc reports whether a policy of namespace ns with the given
// selector applies to the workload; targeted is true when the policy has
// targetRefs.
type AppliesFunc func(ns string, selector map[string]string, targeted bool) bool

// New reads the policies of aps and ras that applies says apply to the
// workload.
func New(aps []*istiosecurityv1.AuthorizationPolicy, ras []*istiosecurityv1.RequestAuthentication, applies AppliesFunc) *Authorization {
	a := &Authorization{}
	for _, ra := range ras {
		if ra == nil || !applies(ra.Namespace, ra.Spec.GetSelector().GetMatchLabels(), len(ra.Spec.GetTargetRefs()) > 0 || ra.Spec.GetTargetRef() != nil) {
			continue
		}
		a.unenforced = append(a.unenforced, UnenforcedPolicy{
			Kind: KindRequestAuthentication, Namespace: ra.Namespace, Name: ra.Name,
			Reason: "JWT validation is not translated in standalone mode",
		})
	}
	for _, ap := range aps {
		if ap == nil || !applies(ap.Namespace, ap.Spec.GetSelector().GetMatchLabels(), len(ap.Spec.GetTargetRefs()) > 0 || ap.Spec.GetTargetRef() != nil) {
			continue
		}
		if reason := unsupported(&ap.Spec); reason != "" {
			a.unenforced = append(a.unenforced, UnenforcedPolicy{Kind: KindAuthorizationPolicy, Namespace: ap.Namespace, Name: ap.Name, Reason: reason})
			continue
		}
		a.policies = append(a.policies, ap)
	}
	sort.Slice(a.policies, func(i, j int) bool {
		return a.policies[i].Namespace+"/"+a.policies[i].Name < a.policies[j].Namespace+"/"+a.policies[j].Name
	})
	sort.Slice(a.unenforced, func(i, j int) bool { return a.unenforced[i].String() < a.unenforced[j].String() })
	return a
}

// Unenforced are the policies that apply but are not enforced, sorted.
func (a *Authorization) Unenforced() []UnenforcedPolicy { return a.unenforced }

// unsupported names the first part of an AuthorizationPolicy that
// translation does not enforce, "" when all of it is.
func unsupported(spec *securityv1beta1.AuthorizationPolicy) string {
	switch spec.GetAction() {
	case securityv1beta1.AuthorizationPolicy_ALLOW, securityv1beta1.AuthorizationPolicy_DENY:
	default:
		return fmt.Sprintf("action %s is not translated", spec.GetAction())
	}
	for i, r := range spec.GetRules() {
		field := fmt.Sprintf("spec.rules[%d]", i)
		if len(r.GetWhen()) > 0 {
			return field + ".when is not translated"
		}
		for j, f := range r.GetFrom() {
			s := f.GetSource()
			ff := fmt.Sprintf("%s.from[%d].source", field, j)
			for name, set := range map[string]bool{
				"requestPrincipals": len(s.GetRequestPrincipals()) > 0, "notRequestPrincipals": len(s.GetNotRequestPrincipals()) > 0,
				"ipBlocks": len(s.GetIpBlocks()) > 0, "notIpBlocks": len(s.GetNotIpBlocks()) > 0,
				"remoteIpBlocks": len(s.GetRemoteIpBlocks()) > 0, "notRemoteIpBlocks": len(s.GetNotRemoteIpBlocks()) > 0,
				"serviceAccounts": len(s.GetServiceAccounts()) > 0, "notServiceAccounts": len(s.GetNotServiceAccounts()) > 0,
				"trustDomains": len(s.GetTrustDomains()) > 0, "notTrustDomains": len(s.GetNotTrustDomains()) > 0,
			} {
				if set {
					return fmt.Sprintf("%s.%s is not translated", ff, name)
				}
			}
			for _, ns := range append(append([]string{}, s.GetNamespaces()...), s.GetNotNamespaces()...) {
				if strings.Contains(ns, "*") || ns == "" {
					return fmt.Sprintf("%s.namespaces: %q: wildcards are not translated", ff, ns)
				}
			}
			for _, p := range append(append([]string{}, s.GetPrincipals()...), s.GetNotPrincipals()...) {
				if p == "" || strings.Count(p, "*") > 1 || (strings.Contains(p, "*") && !strings.HasPrefix(p, "*") && !strings.HasSuffix(p, "*")) {
					return fmt.Sprintf("%s.principals: %q: only a leading or trailing * is translated", ff, p)
				}
			}
		}
		for j, t := range r.GetTo() {
			o := t.GetOperation()
			tf := fmt.Sprintf("%s.to[%d].operation", field, j)
			if len(o.GetHosts()) > 0 || len(o.GetNotHosts()) > 0 {
				return tf + ".hosts is not translated"
			}
			for _, p := range append(append([]string{}, o.GetPorts()...), o.GetNotPorts()...) {
				if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
					return fmt.Sprintf("%s.ports: %q is not a port number", tf, p)
				}
			}
			for _, p := range append(append([]string{}, o.GetPaths()...), o.GetNotPaths()...) {
				if p == "" || (p != "*" && (strings.Count(p, "*") > 1 || (strings.Contains(p, "*") && !strings.HasPrefix(p, "*") && !strings.HasSuffix(p, "*")))) {
					return fmt.Sprintf("%s.paths: %q: only a leading or trailing * is translated", tf, p)
				}
			}
			for _, m := range append(append([]string{}, o.GetMethods()...), o.GetNotMethods()...) {
				if m == "" || strings.Contains(m, "*") && m != "*" {
					return fmt.Sprintf("%s.methods: %q: only * or a method is translated", tf, m)
				}
			}
		}
	}
	return ""
}

// refuseAll is an RBAC configuration that matches no request: an ALLOW
// action with no policies.
func refuseAll() *rbacv3.RBAC { return &rbacv3.RBAC{Action: rbacv3.RBAC_ALLOW} }

// rbacRules are the DENY and ALLOW rule sets of the chain (nil: no filter
// of that action). forTCP drops what only HTTP carries, as Istio does: an
// ALLOW rule needing an HTTP attribute matches nothing, a DENY rule is
// enforced without its HTTP attributes (it denies more, never less).
func (a *Authorization) rbacRules(forTCP bool) (deny, allow *rbacv3.RBAC) {
	if len(a.unenforced) > 0 {
		return nil, refuseAll()
	}
	for _, ap := range a.policies {
		isDeny := ap.Spec.GetAction() == securityv1beta1.AuthorizationPolicy_DENY
		target := &allow
		if isDeny {
			target = &deny
		}
		if *target == nil {
			act := rbacv3.RBAC_ALLOW
			if isDeny {
				act = rbacv3.RBAC_DENY
			}
			*target = &rbacv3.RBAC{Action: act, Policies: map[string]*rbacv3.Policy{}}
		}
		for i, r := range ap.Spec.GetRules() {
			p, ok := a.rulePolicy(ap, r, forTCP, isDeny)
			if !ok {
				continue
			}
			(*target).Policies[fmt.Sprintf("ns[%s]-policy[%s]-rule[%d]", ap.Namespace, ap.Name, i)] = p
		}
	}
	return deny, allow
}

// rulePolicy is one rule as an RBAC policy: any of its sources and any of
// its operations; ok is false when the rule can match nothing on this chain.
func (a *Authorization) rulePolicy(ap *istiosecurityv1.AuthorizationPolicy, r *securityv1beta1.Rule, forTCP, isDeny bool) (*rbacv3.Policy, bool) {
	p := &rbacv3.Policy{}
	for _, f := range r.GetFrom() {
		p.Principals = append(p.Principals, a.sourcePrincipal(f.GetSource()))
	}
	if len(p.Principals) == 0 {
		p.Principals = []*rbacv3.Principal{{Identifier: &rbacv3.Principal_Any{Any: true}}}
	}
	for _, t := range r.GetTo() {
		perm, ok := operationPermission(t.GetOperation(), forTCP, isDeny)
		if ok {
			p.Permissions = append(p.Permissions, perm)
		}
	}
	if len(r.GetTo()) > 0 && len(p.Permissions) == 0 {
		return nil, false
	}
	if len(p.Permissions) == 0 {
		p.Permissions = []*rbacv3.Permission{{Rule: &rbacv3.Permission_Any{Any: true}}}
	}
	return p, true
}

func (a *Authorization) sourcePrincipal(s *securityv1beta1.Source) *rbacv3.Principal {
	var and []*rbacv3.Principal
	add := func(values []string, negate bool, m func(string) *matcherv3.StringMatcher) {
		if len(values) == 0 {
			return
		}
		var or []*rbacv3.Principal
		for _, v := range values {
			or = append(or, &rbacv3.Principal{Identifier: &rbacv3.Principal_Authenticated_{
				Authenticated: &rbacv3.Principal_Authenticated{PrincipalName: m(v)},
			}})
		}
		id := orPrincipal(or)
		if negate {
			id = &rbacv3.Principal{Identifier: &rbacv3.Principal_NotId{NotId: id}}
		}
		and = append(and, id)
	}
	add(s.GetPrincipals(), false, principalMatcher)
	add(s.GetNotPrincipals(), true, principalMatcher)
	add(s.GetNamespaces(), false, namespaceMatcher)
	add(s.GetNotNamespaces(), true, namespaceMatcher)
	if len(and) == 0 {
		return &rbacv3.Principal{Identifier: &rbacv3.Principal_Any{Any: true}}
	}
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_AndIds{AndIds: &rbacv3.Principal_Set{Ids: and}}}
}

func orPrincipal(ids []*rbacv3.Principal) *rbacv3.Principal {
	if len(ids) == 1 {
		return ids[0]
	}
	return &rbacv3.Principal{Identifier: &rbacv3.Principal_OrIds{OrIds: &rbacv3.Principal_Set{Ids: ids}}}
}

// principalMatcher matches the peer's SPIFFE ID for an Istio principal
// ("<trust domain>/ns/<ns>/sa/<sa>"), with Istio's wildcards: "*" any
// authenticated peer, "x*" a prefix, "*x" a suffix.
func principalMatcher(v string) *matcherv3.StringMatcher {
	switch {
	case v == "*":
		return regexMatcher(".+")
	case strings.HasPrefix(v, "*"):
		return regexMatcher("spiffe://.*" + regexp.QuoteMeta(strings.TrimPrefix(v, "*")))
	case strings.HasSuffix(v, "*"):
		return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "spiffe://" + strings.TrimSuffix(v, "*")}}
	}
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "spiffe://" + v}}
}

// namespaceMatcher matches the peer's SPIFFE IDs of a namespace.
func namespaceMatcher(ns string) *matcherv3.StringMatcher {
	return regexMatcher(".*/ns/" + regexp.QuoteMeta(ns) + "/.*")
}

func regexMatcher(re string) *matcherv3.StringMatcher {
	return &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: re}}}
}

// operationPermission is an Operation as an RBAC permission; ok is false
// when it can match nothing on this chain.
func operationPermission(o *securityv1beta1.Operation, forTCP, isDeny bool) (*rbacv3.Permission, bool) {
	httpOnly := len(o.GetMethods()) > 0 || len(o.GetNotMethods()) > 0 || len(o.GetPaths()) > 0 || len(o.GetNotPaths()) > 0
	if forTCP && httpOnly && !isDeny {
		return nil, false
	}
	var and []*rbacv3.Permission
	add := func(values []string, negate bool, m func(string) *rbacv3.Permission) {
		if len(values) == 0 {
			return
		}
		var or []*rbacv3.Permission
		for _, v := range values {
			or = append(or, m(v))
		}
		perm := or[0]
		if len(or) > 1 {
			perm = &rbacv3.Permission{Rule: &rbacv3.Permission_OrRules{OrRules: &rbacv3.Permission_Set{Rules: or}}}
		}
		if negate {
			perm = &rbacv3.Permission{Rule: &rbacv3.Permission_NotRule{NotRule: perm}}
		}
		and = append(and, perm)
	}
	port := func(v string) *rbacv3.Permission {
		n, _ := strconv.ParseUint(v, 10, 16) // checked by unsupported
		return &rbacv3.Permission{Rule: &rbacv3.Permission_DestinationPort{DestinationPort: uint32(n)}}
	}
	add(o.GetPorts(), false, port)
	add(o.GetNotPorts(), true, port)
	if !forTCP {
		add(o.GetMethods(), false, methodPermission)
		add(o.GetNotMethods(), true, methodPermission)
		add(o.GetPaths(), false, pathPermission)
		add(o.GetNotPaths(), true, pathPermission)
	}
	if len(and) == 0 {
		return &rbacv3.Permission{Rule: &rbacv3.Permission_Any{Any: true}}, true
	}
	return &rbacv3.Permission{Rule: &rbacv3.Permission_AndRules{AndRules: &rbacv3.Permission_Set{Rules: and}}}, true
}

func methodPermission(m string) *rbacv3.Permission {
	sm := &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: m}}
	if m == "*" {
		sm = regexMatcher(".+")
	}
	return &rbacv3.Permission{Rule: &rbacv3.Permission_Header{Header: &routev3.HeaderMatcher{
		Name: ":method", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: sm},
	}}}
}

func pathPermission(p string) *rbacv3.Permission {
	var sm *matcherv3.StringMatcher
	switch {
	case p == "*":
		sm = regexMatcher(".+")
	case strings.HasPrefix(p, "*"):
		sm = &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Suffix{Suffix: strings.TrimPrefix(p, "*")}}
	case strings.HasSuffix(p, "*"):
		sm = &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: strings.TrimSuffix(p, "*")}}
	default:
		sm = &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: p}}
	}
	return &rbacv3.Permission{Rule: &rbacv3.Permission_UrlPath{UrlPath: &matcherv3.PathMatcher{Rule: &matcherv3.PathMatcher_Path{Path: sm}}}}
}

// NetworkFilters are the RBAC network filters a TCP chain starts with.
func (a *Authorization) NetworkFilters(port uint32) []*listenerv3.Filter {
	deny, allow := a.rbacRules(true)
	var out []*listenerv3.Filter
	for _, r := range []*rbacv3.RBAC{deny, allow} {
		if r == nil {
			continue
		}
		out = append(out, &listenerv3.Filter{
			Name: wellknown.RoleBasedAccessControl,
			ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: envoyconf.MustAny(&netrbacv3.RBAC{
				Rules: r, StatPrefix: fmt.Sprintf("inbound_%d.", port),
			})},
		})
	}
	return out
}

// HTTPFilters are the RBAC HTTP filters an HTTP chain runs before its
// router.
func (a *Authorization) HTTPFilters() []*hcmv3.HttpFilter {
	deny, allow := a.rbacRules(false)
	var out []*hcmv3.HttpFilter
	for _, r := range []*rbacv3.RBAC{deny, allow} {
		if r == nil {
			continue
		}
		out = append(out, &hcmv3.HttpFilter{
			Name:       wellknown.HTTPRoleBasedAccessControl,
			ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: envoyconf.MustAny(&httprbacv3.RBAC{Rules: r})},
		})
	}
	return out
}
