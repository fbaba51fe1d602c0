package configsource

import (
	"context"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	httprbacv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	securityapi "istio.io/api/security/v1beta1"
	typeapi "istio.io/api/type/v1beta1"
	istiosecurityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// inboundRBAC is the RBAC HTTP filters of the listener's first chain, by
// action ("ALLOW"/"DENY") to their policy names; ok is false until the
// listener is served.
func (s *stream) inboundRBAC(t *testing.T, listener string) (rbac []map[string]bool, actions []string, ok bool) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.latest[resource.ListenerType].GetResources() {
		l := &listenerv3.Listener{}
		if err := a.UnmarshalTo(l); err != nil {
			t.Fatal(err)
		}
		if l.GetName() != listener {
			continue
		}
		for _, f := range l.GetFilterChains()[0].GetFilters() {
			if f.GetName() != wellknown.HTTPConnectionManager {
				continue
			}
			hcm := &hcmv3.HttpConnectionManager{}
			if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
				t.Fatal(err)
			}
			for _, hf := range hcm.GetHttpFilters() {
				if hf.GetName() != wellknown.HTTPRoleBasedAccessControl {
					continue
				}
				r := &httprbacv3.RBAC{}
				if err := hf.GetTypedConfig().UnmarshalTo(r); err != nil {
					t.Fatal(err)
				}
				names := map[string]bool{}
				for n := range r.GetRules().GetPolicies() {
					names[n] = true
				}
				rbac = append(rbac, names)
				actions = append(actions, r.GetRules().GetAction().String())
			}
		}
		return rbac, actions, true
	}
	return nil, nil, false
}

// waitCondition waits for the registration's ConfigurationEnforced
// condition to satisfy ok.
func waitCondition(t *testing.T, w *workload, ok func(*metav1.Condition) bool) *metav1.Condition {
	t.Helper()
	var got *metav1.Condition
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		war := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := env.Client.Get(ctx, w.key, war); err != nil {
			return false, err
		}
		got = meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionConfigurationEnforced)
		return ok(got), nil
	})
	if err != nil {
		t.Fatalf("ConfigurationEnforced condition is %+v: %v", got, err)
	}
	return got
}

// TestUnenforcedPolicyFailsClosed: an AuthorizationPolicy selecting the VM
// that standalone translation cannot enforce makes its inbound listener
// refuse everything, records a ConfigurationWarning Event on its
// registration and sets ConfigurationEnforced=False naming the policy; once
// only enforceable policies select it, they are served as RBAC and the
// condition turns True.
func TestUnenforcedPolicyFailsClosed(t *testing.T) {
	e := startEndpoint(t)
	ns := env.Namespace(t)
	w := register(t, e, ns, "10.0.0.20")
	ctx := t.Context()
	if err := env.Client.Create(ctx, seed004Sidecar(ns)); err != nil {
		t.Fatal(err)
	}
	s := subscribe(t, e, w)
	inbound := "10.0.0.20_8080"
	s.waitNames(t, "Sidecar", resource.ListenerType, has(inbound))
	if rbac, _, _ := s.inboundRBAC(t, inbound); len(rbac) != 0 {
		t.Fatalf("RBAC filters %v before any policy", rbac)
	}
	if err := env.Client.Get(ctx, w.key, &runtimev1alpha1.WorkloadAutoRegistration{}); err != nil {
		t.Fatal(err)
	}

	// A policy with a `when` condition: not enforced, so refuse all.
	byClaim := &istiosecurityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "by-claim", Namespace: ns}}
	byClaim.Spec.Selector = &typeapi.WorkloadSelector{MatchLabels: map[string]string{"app": "ratings"}}
	byClaim.Spec.Rules = []*securityapi.Rule{{When: []*securityapi.Condition{{Key: "request.auth.claims[iss]", Values: []string{"x"}}}}}
	if err := env.Client.Create(ctx, byClaim); err != nil {
		t.Fatal(err)
	}
	refuseAll := func() bool {
		rbac, actions, ok := s.inboundRBAC(t, inbound)
		return ok && len(rbac) == 1 && len(rbac[0]) == 0 && actions[0] == "ALLOW"
	}
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) { return refuseAll(), nil }); err != nil {
		rbac, actions, _ := s.inboundRBAC(t, inbound)
		t.Fatalf("inbound listener does not refuse all: RBAC %v %v", actions, rbac)
	}
	policyName := "AuthorizationPolicy " + ns + "/by-claim"
	cond := waitCondition(t, w, func(c *metav1.Condition) bool { return c != nil && c.Status == metav1.ConditionFalse })
	if cond.Reason != runtimev1alpha1.ReasonUnsupportedPolicy || !strings.Contains(cond.Message, policyName) || !strings.Contains(cond.Message, "spec.rules[0].when") {
		t.Errorf("condition %s %q, want reason %s naming %s and its when", cond.Reason, cond.Message, runtimev1alpha1.ReasonUnsupportedPolicy, policyName)
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		l := &corev1.EventList{}
		if err := env.Client.List(ctx, l, client.InNamespace(ns)); err != nil {
			return false, err
		}
		for _, ev := range l.Items {
			if ev.Reason == ReasonConfigurationWarning && ev.Type == corev1.EventTypeWarning &&
				ev.InvolvedObject.Kind == "WorkloadAutoRegistration" && ev.InvolvedObject.Name == w.key.Name && strings.Contains(ev.Message, policyName) {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no ConfigurationWarning Event on the registration naming %s: %v", policyName, err)
	}

	// The unenforceable policy replaced by an enforceable one: RBAC with
	// its rule, and the condition says everything is enforced.
	if err := env.Client.Delete(ctx, byClaim); err != nil {
		t.Fatal(err)
	}
	fromNS := &istiosecurityv1.AuthorizationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "from-bookinfo", Namespace: ns}}
	fromNS.Spec.Rules = []*securityapi.Rule{{From: []*securityapi.Rule_From{{Source: &securityapi.Source{Namespaces: []string{ns}}}}}}
	if err := env.Client.Create(ctx, fromNS); err != nil {
		t.Fatal(err)
	}
	want := "ns[" + ns + "]-policy[from-bookinfo]-rule[0]"
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		rbac, _, _ := s.inboundRBAC(t, inbound)
		return len(rbac) == 1 && rbac[0][want], nil
	}); err != nil {
		rbac, actions, _ := s.inboundRBAC(t, inbound)
		t.Fatalf("inbound RBAC %v %v, want ALLOW %s", actions, rbac, want)
	}
	cond = waitCondition(t, w, func(c *metav1.Condition) bool { return c != nil && c.Status == metav1.ConditionTrue })
	if cond.Reason != runtimev1alpha1.ReasonPoliciesEnforced {
		t.Errorf("condition reason %s, want %s", cond.Reason, runtimev1alpha1.ReasonPoliciesEnforced)
	}
}

// TestPodServiceAccountsNameTheSAN: outbound mutual TLS toward a Service
// whose endpoints are pods accepts exactly the pods' service accounts, not
// any identity of the namespace.
func TestPodServiceAccountsNameTheSAN(t *testing.T) {
	e := startEndpoint(t)
	ns := env.Namespace(t)
	w := register(t, e, ns, "10.0.0.21")
	ctx := t.Context()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "details-v1-1", Namespace: ns, Labels: map[string]string{"app": "details"}}}
	pod.Spec.ServiceAccountName = "details-sa"
	pod.Spec.Containers = []corev1.Container{{Name: "details", Image: "details"}}
	svc, es := detailsService(ns)
	es.Endpoints[0].TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: pod.Name, Namespace: ns}
	for _, o := range []client.Object{seed004Sidecar(ns), svc, es, pod} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	s := subscribe(t, e, w)
	details := "outbound|8080||details." + ns + ".svc.cluster.local"
	s.waitNames(t, "Sidecar", resource.ClusterType, has(details))
	want := "spiffe://cluster.local/ns/" + ns + "/sa/details-sa"
	var got []string
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		got = s.clusterSANs(t, details)
		return len(got) == 1 && got[0] == "exact:"+want, nil
	}); err != nil {
		t.Fatalf("SANs of %s = %v, want only exact:%s", details, got, want)
	}
}

// clusterSANs are the SAN matchers of a cluster's upstream TLS as
// "exact:<v>" or "prefix:<v>".
func (s *stream) clusterSANs(t *testing.T, name string) []string {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.latest[resource.ClusterType].GetResources() {
		c := &clusterv3.Cluster{}
		if err := a.UnmarshalTo(c); err != nil {
			t.Fatal(err)
		}
		if c.GetName() != name {
			continue
		}
		tls := &tlsv3.UpstreamTlsContext{}
		if err := c.GetTransportSocket().GetTypedConfig().UnmarshalTo(tls); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range tls.GetCommonTlsContext().GetCombinedValidationContext().GetDefaultValidationContext().GetMatchTypedSubjectAltNames() {
			if v := m.GetMatcher().GetExact(); v != "" {
				out = append(out, "exact:"+v)
			}
			if v := m.GetMatcher().GetPrefix(); v != "" {
				out = append(out, "prefix:"+v)
			}
		}
		return out
	}
	return nil
}
