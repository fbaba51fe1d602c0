package adversarial

import (
	"testing"

	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacv3 "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	httprbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netrbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	networkingapi "istio.io/api/networking/v1alpha3"
	securityapi "istio.io/api/security/v1beta1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istiosecurityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/embark-mesh/embark/translate"
)

// TestUnenforceablePolicyIsNotASilentAllow: a mesh operator protects a VM
// with a policy standalone translation cannot express; an attacker who
// would be refused by istiod's configuration must not be let in because
// the policy was dropped. Every ingress chain must refuse all traffic (no
// Envoy here: the served RBAC is read back).
func TestUnenforceablePolicyIsNotASilentAllow(t *testing.T) {
	Attack(t, "reach a VM whose AuthorizationPolicy or RequestAuthentication standalone translation cannot enforce")
	rule := func(r *securityapi.Rule) *securityapi.AuthorizationPolicy {
		return &securityapi.AuthorizationPolicy{Rules: []*securityapi.Rule{r}}
	}
	aps := map[string]*securityapi.AuthorizationPolicy{
		"only callers with a JWT": rule(&securityapi.Rule{From: []*securityapi.Rule_From{{Source: &securityapi.Source{RequestPrincipals: []string{"*"}}}}}),
		"only from the office":    rule(&securityapi.Rule{From: []*securityapi.Rule_From{{Source: &securityapi.Source{IpBlocks: []string{"192.0.2.0/24"}}}}}),
		"only with a header":      rule(&securityapi.Rule{When: []*securityapi.Condition{{Key: "request.headers[x-admin]", Values: []string{"yes"}}}}),
		"only for one host":       rule(&securityapi.Rule{To: []*securityapi.Rule_To{{Operation: &securityapi.Operation{Hosts: []string{"ratings.internal"}}}}}),
		"external authorizer":     {Action: securityapi.AuthorizationPolicy_CUSTOM},
	}
	for name, spec := range aps {
		t.Run(name, func(t *testing.T) {
			ap := &istiosecurityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "bookinfo", Name: "guard"}}
			ap.Spec.Rules, ap.Spec.Action = spec.Rules, spec.Action
			checkRefused(t, []*istiosecurityv1.AuthorizationPolicy{ap}, nil)
		})
	}
	t.Run("RequestAuthentication", func(t *testing.T) {
		checkRefused(t, nil, []*istiosecurityv1.RequestAuthentication{{ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "jwt"}}})
	})
}

func checkRefused(t *testing.T, aps []*istiosecurityv1.AuthorizationPolicy, ras []*istiosecurityv1.RequestAuthentication) {
	t.Helper()
	sc := &istionetworkingv1.Sidecar{ObjectMeta: metav1.ObjectMeta{Namespace: "bookinfo", Name: "vm"}}
	sc.Spec.Ingress = []*networkingapi.IstioIngressListener{
		{Port: &networkingapi.SidecarPort{Number: 9080, Protocol: "HTTP", Name: "http"}, DefaultEndpoint: "127.0.0.1:9080"},
		{Port: &networkingapi.SidecarPort{Number: 5432, Protocol: "TCP", Name: "tcp"}, DefaultEndpoint: "127.0.0.1:5432"},
	}
	// An enforceable, permissive policy beside it must not reopen the door.
	allowAll := &istiosecurityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "bookinfo", Name: "allow-all"}}
	allowAll.Spec.Rules = []*securityapi.Rule{{}}
	res, err := translate.Translate(&translate.Inputs{
		Workload:               translate.Workload{Name: "vm", Namespace: "bookinfo", Address: "10.0.0.10", Labels: map[string]string{"app": "ratings"}},
		Sidecars:               []*istionetworkingv1.Sidecar{sc},
		AuthorizationPolicies:  append(aps, allowAll),
		RequestAuthentications: ras,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(res.Unenforced) != 1 {
		t.Errorf("Unenforced = %v, want the one policy", res.Unenforced)
	}
	chains := 0
	for _, r := range res.Listeners {
		l := r.(*listenerv3.Listener)
		for _, fc := range l.GetFilterChains() {
			chains++
			rules := chainRules(t, fc)
			if len(rules) != 1 || rules[0].GetAction() != rbacv3.RBAC_ALLOW || len(rules[0].GetPolicies()) != 0 {
				t.Errorf("listener %s chain %s: RBAC %v, want exactly one that refuses everything", l.GetName(), fc.GetName(), rules)
			}
		}
	}
	if chains < 4 {
		t.Errorf("%d ingress chains checked, want the mTLS and plaintext chains of both ports", chains)
	}
}

// chainRules are the RBAC rules a filter chain enforces, network and HTTP.
func chainRules(t *testing.T, fc *listenerv3.FilterChain) []*rbacv3.RBAC {
	t.Helper()
	var out []*rbacv3.RBAC
	for _, f := range fc.GetFilters() {
		switch f.GetName() {
		case wellknown.RoleBasedAccessControl:
			m := &netrbacv3.RBAC{}
			if err := f.GetTypedConfig().UnmarshalTo(m); err != nil {
				t.Fatal(err)
			}
			out = append(out, m.GetRules())
		case wellknown.HTTPConnectionManager:
			hcm := &hcmv3.HttpConnectionManager{}
			if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
				t.Fatal(err)
			}
			for _, hf := range hcm.GetHttpFilters() {
				if hf.GetName() == wellknown.HTTPRoleBasedAccessControl {
					m := &httprbacv3.RBAC{}
					if err := hf.GetTypedConfig().UnmarshalTo(m); err != nil {
						t.Fatal(err)
					}
					out = append(out, m.GetRules())
				}
			}
		}
	}
	return out
}
