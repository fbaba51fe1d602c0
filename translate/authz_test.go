package translate

import (
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	httprbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netrbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	securityv1beta1 "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istiosecurityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// authzInputs is a workload with one HTTP and one TCP ingress port and the
// given policies.
func authzInputs(aps []*istiosecurityv1.AuthorizationPolicy, ras []*istiosecurityv1.RequestAuthentication) *Inputs {
	sc := &istionetworkingv1.Sidecar{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "vm"}}
	sc.Spec.Ingress = []*networkingv1alpha3.IstioIngressListener{
		{Port: &networkingv1alpha3.SidecarPort{Number: 8080, Protocol: "HTTP", Name: "http"}, DefaultEndpoint: "127.0.0.1:8080"},
		{Port: &networkingv1alpha3.SidecarPort{Number: 5432, Protocol: "TCP", Name: "tcp"}, DefaultEndpoint: "127.0.0.1:5432"},
	}
	return &Inputs{
		Workload:               Workload{Name: "vm", Namespace: "shop", Address: "10.0.0.10", Labels: map[string]string{"app": "db"}},
		Sidecars:               []*istionetworkingv1.Sidecar{sc},
		AuthorizationPolicies:  aps,
		RequestAuthentications: ras,
	}
}

func authzPolicy(ns, name string, sel map[string]string, spec *securityv1beta1.AuthorizationPolicy) *istiosecurityv1.AuthorizationPolicy {
	ap := &istiosecurityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if spec != nil {
		proto.Merge(&ap.Spec, spec)
	}
	if sel != nil {
		ap.Spec.Selector = &typev1beta1.WorkloadSelector{MatchLabels: sel}
	}
	return ap
}

// chainRBAC returns, per ingress listener port, the RBAC rules of its first filter
// chain in order (HTTP filters for HTTP chains, network filters for TCP).
func chainRBAC(t *testing.T, res *Result) map[uint32][]*rbacv3.RBAC {
	t.Helper()
	out := map[uint32][]*rbacv3.RBAC{}
	for _, r := range res.Listeners {
		l := r.(*listenerv3.Listener)
		if l.GetTrafficDirection() != corev3.TrafficDirection_INBOUND {
			continue
		}
		port := l.GetAddress().GetSocketAddress().GetPortValue()
		out[port] = []*rbacv3.RBAC{}
		for _, f := range l.GetFilterChains()[0].GetFilters() {
			switch f.GetName() {
			case wellknown.RoleBasedAccessControl:
				m := &netrbacv3.RBAC{}
				if err := f.GetTypedConfig().UnmarshalTo(m); err != nil {
					t.Fatal(err)
				}
				out[port] = append(out[port], m.GetRules())
			case wellknown.HTTPConnectionManager:
				hcm := &hcmv3.HttpConnectionManager{}
				if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
					t.Fatal(err)
				}
				for _, hf := range hcm.GetHttpFilters() {
					if hf.GetName() != wellknown.HTTPRoleBasedAccessControl {
						continue
					}
					m := &httprbacv3.RBAC{}
					if err := hf.GetTypedConfig().UnmarshalTo(m); err != nil {
						t.Fatal(err)
					}
					out[port] = append(out[port], m.GetRules())
				}
			}
		}
	}
	return out
}

// summary is "<action>:<policy names>" per RBAC filter; "refuse-all" for an
// ALLOW filter with no policy.
func summary(rs []*rbacv3.RBAC) []string {
	var out []string
	for _, r := range rs {
		if r.GetAction() == rbacv3.RBAC_ALLOW && len(r.GetPolicies()) == 0 {
			out = append(out, "refuse-all")
			continue
		}
		var names []string
		for n := range r.GetPolicies() {
			names = append(names, n)
		}
		slices.Sort(names)
		out = append(out, r.GetAction().String()+":"+strings.Join(names, ","))
	}
	return out
}

func TestAuthorization(t *testing.T) {
	methodsOnly := &securityv1beta1.AuthorizationPolicy{Rules: []*securityv1beta1.Rule{{
		To: []*securityv1beta1.Rule_To{{Operation: &securityv1beta1.Operation{Methods: []string{"GET"}}}},
	}}}
	denyPaths := &securityv1beta1.AuthorizationPolicy{Action: securityv1beta1.AuthorizationPolicy_DENY, Rules: []*securityv1beta1.Rule{{
		To: []*securityv1beta1.Rule_To{{Operation: &securityv1beta1.Operation{Paths: []string{"/admin"}}}},
	}}}
	fromNS := &securityv1beta1.AuthorizationPolicy{Rules: []*securityv1beta1.Rule{{
		From: []*securityv1beta1.Rule_From{{Source: &securityv1beta1.Source{Namespaces: []string{"shop"}}}},
	}}}
	tests := []struct {
		name           string
		aps            []*istiosecurityv1.AuthorizationPolicy
		ras            []*istiosecurityv1.RequestAuthentication
		wantHTTP       []string
		wantTCP        []string
		wantUnenforced []string
	}{
		{name: "no policy: no RBAC filter", wantHTTP: nil, wantTCP: nil},
		{name: "ALLOW with methods: HTTP allows GETs, TCP allows nothing",
			aps:      []*istiosecurityv1.AuthorizationPolicy{authzPolicy("shop", "get", nil, methodsOnly)},
			wantHTTP: []string{"ALLOW:ns[shop]-policy[get]-rule[0]"}, wantTCP: []string{"refuse-all"}},
		{name: "DENY with paths: TCP denies without the path condition",
			aps:      []*istiosecurityv1.AuthorizationPolicy{authzPolicy("shop", "admin", nil, denyPaths)},
			wantHTTP: []string{"DENY:ns[shop]-policy[admin]-rule[0]"}, wantTCP: []string{"DENY:ns[shop]-policy[admin]-rule[0]"}},
		{name: "DENY before ALLOW",
			aps: []*istiosecurityv1.AuthorizationPolicy{
				authzPolicy("shop", "from-ns", map[string]string{"app": "db"}, fromNS),
				authzPolicy("istio-system", "admin", nil, denyPaths),
			},
			wantHTTP: []string{"DENY:ns[istio-system]-policy[admin]-rule[0]", "ALLOW:ns[shop]-policy[from-ns]-rule[0]"},
			wantTCP:  []string{"DENY:ns[istio-system]-policy[admin]-rule[0]", "ALLOW:ns[shop]-policy[from-ns]-rule[0]"}},
		{name: "empty ALLOW policy allows nothing",
			aps:      []*istiosecurityv1.AuthorizationPolicy{authzPolicy("shop", "allow-nothing", nil, nil)},
			wantHTTP: []string{"refuse-all"}, wantTCP: []string{"refuse-all"}},
		{name: "policies of other workloads, namespaces and targetRefs do not apply",
			aps: []*istiosecurityv1.AuthorizationPolicy{
				authzPolicy("shop", "web", map[string]string{"app": "web"}, nil),
				authzPolicy("other", "ns-wide", nil, nil),
				func() *istiosecurityv1.AuthorizationPolicy {
					ap := authzPolicy("shop", "gateway", nil, nil)
					ap.Spec.TargetRefs = []*typev1beta1.PolicyTargetReference{{Kind: "Gateway", Name: "gw"}}
					return ap
				}(),
			}},
		{name: "CUSTOM action fails closed",
			aps: []*istiosecurityv1.AuthorizationPolicy{
				authzPolicy("shop", "ext", nil, &securityv1beta1.AuthorizationPolicy{Action: securityv1beta1.AuthorizationPolicy_CUSTOM}),
				authzPolicy("shop", "from-ns", nil, fromNS),
			},
			wantHTTP: []string{"refuse-all"}, wantTCP: []string{"refuse-all"},
			wantUnenforced: []string{"AuthorizationPolicy shop/ext: action CUSTOM is not translated"}},
		{name: "ipBlocks fail closed",
			aps: []*istiosecurityv1.AuthorizationPolicy{authzPolicy("istio-system", "ips", map[string]string{"app": "db"}, &securityv1beta1.AuthorizationPolicy{
				Rules: []*securityv1beta1.Rule{{From: []*securityv1beta1.Rule_From{{Source: &securityv1beta1.Source{IpBlocks: []string{"10.0.0.0/8"}}}}}},
			})},
			wantHTTP: []string{"refuse-all"}, wantTCP: []string{"refuse-all"},
			wantUnenforced: []string{"AuthorizationPolicy istio-system/ips: spec.rules[0].from[0].source.ipBlocks is not translated"}},
		{name: "RequestAuthentication of the namespace fails closed",
			ras:      []*istiosecurityv1.RequestAuthentication{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "jwt"}}},
			wantHTTP: []string{"refuse-all"}, wantTCP: []string{"refuse-all"},
			wantUnenforced: []string{"RequestAuthentication shop/jwt: JWT validation is not translated in standalone mode"}},
		{name: "RequestAuthentication of another workload does not apply",
			ras: []*istiosecurityv1.RequestAuthentication{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "jwt"},
				Spec: securityv1beta1.RequestAuthentication{Selector: &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": "web"}}}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Translate(authzInputs(tt.aps, tt.ras))
			if err != nil {
				t.Fatal(err)
			}
			if err := res.Validate(); err != nil {
				t.Fatalf("does not validate: %v", err)
			}
			var unenforced []string
			for _, u := range res.Unenforced {
				unenforced = append(unenforced, u.String())
			}
			if !slices.Equal(unenforced, tt.wantUnenforced) {
				t.Errorf("Unenforced = %q, want %q", unenforced, tt.wantUnenforced)
			}
			got := chainRBAC(t, res)
			if g := summary(got[8080]); !slices.Equal(g, tt.wantHTTP) {
				t.Errorf("HTTP chain RBAC = %q, want %q", g, tt.wantHTTP)
			}
			if g := summary(got[5432]); !slices.Equal(g, tt.wantTCP) {
				t.Errorf("TCP chain RBAC = %q, want %q", g, tt.wantTCP)
			}
		})
	}
}

// TestUnenforcedWithoutSidecar: a policy that cannot be enforced is
// reported even when the workload has no listener to refuse on.
func TestUnenforcedWithoutSidecar(t *testing.T) {
	in := authzInputs(nil, []*istiosecurityv1.RequestAuthentication{{ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "mesh-jwt"}}})
	in.Sidecars = nil
	res, err := Translate(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Listeners) != 0 || len(res.Unenforced) != 1 || res.Unenforced[0].Name != "mesh-jwt" {
		t.Fatalf("listeners %d, unenforced %v; want none and mesh-jwt", len(res.Listeners), res.Unenforced)
	}
}
