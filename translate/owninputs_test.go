package translate

import (
	"bytes"
	"testing"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	securityv1beta1 "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istiosecurityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestOwnInputs: a change of the inputs keeps a workload's OwnInputs Equal only
// if For gives it the same own resources (or error) after it, for every
// workload of the scope (every address and labels of variants), and keeps
// it for the changes that leave the ingress side alone (an egress bind, a
// Service, the Sidecar's metadata), so a caller can keep the workloads' own
// resources across those.
func TestOwnInputs(t *testing.T) {
	base := func(t *testing.T) *Inputs {
		in := &Inputs{
			Workload: Workload{Name: "vm", Namespace: "shop", Address: "10.0.0.10", Labels: map[string]string{"app": "db"}},
			Sidecars: []*istionetworkingv1.Sidecar{sidecarYAML(t, `
  ingress:
  - {port: {number: 8080, protocol: HTTP, name: http}, defaultEndpoint: "127.0.0.1:8080"}
  - {port: {number: 9000, protocol: TCP, name: own}, defaultEndpoint: "0.0.0.0:9000"}
  egress:
  - {bind: 127.0.0.2, hosts: ["./*"]}
  - {bind: 10.9.9.8, port: {number: 7070, protocol: HTTP, name: x}, hosts: ["./*"]}`)},
			Services: []*corev1.Service{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
				Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}},
			AuthorizationPolicies: []*istiosecurityv1.AuthorizationPolicy{authzPolicy("shop", "allow", map[string]string{"app": "db"}, &securityv1beta1.AuthorizationPolicy{
				Rules: []*securityv1beta1.Rule{{From: []*securityv1beta1.Rule_From{{Source: &securityv1beta1.Source{Principals: []string{"cluster.local/ns/shop/sa/web"}}}}}},
			})},
		}
		pa := &istiosecurityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "default"}}
		pa.Spec.Mtls = &securityv1beta1.PeerAuthentication_MutualTLS{Mode: securityv1beta1.PeerAuthentication_MutualTLS_STRICT}
		in.PeerAuthentications = []*istiosecurityv1.PeerAuthentication{pa}
		return in
	}
	cases := []struct {
		name   string
		change func(t *testing.T, in *Inputs)
		keeps  bool
	}{
		{"nothing", func(*testing.T, *Inputs) {}, true},
		{"egress bind", func(_ *testing.T, in *Inputs) { in.Sidecars[0].Spec.Egress[0].Bind = "127.0.0.3" }, true},
		{"a Service added", func(_ *testing.T, in *Inputs) {
			in.Services = append(in.Services, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "api"},
				Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: 9090}}}})
		}, true},
		{"Sidecar metadata", func(_ *testing.T, in *Inputs) {
			in.Sidecars[0].ResourceVersion, in.Sidecars[0].Annotations = "42", map[string]string{"a": "b"}
		}, true},
		{"ingress defaultEndpoint", func(_ *testing.T, in *Inputs) { in.Sidecars[0].Spec.Ingress[0].DefaultEndpoint = "127.0.0.1:8081" }, false},
		{"ingress port", func(_ *testing.T, in *Inputs) { in.Sidecars[0].Spec.Ingress[1].Port.Number = 9001 }, false},
		{"ingress protocol", func(_ *testing.T, in *Inputs) { in.Sidecars[0].Spec.Ingress[0].Port.Protocol = "HTTP2" }, false},
		{"ingress bind", func(_ *testing.T, in *Inputs) { in.Sidecars[0].Spec.Ingress[0].Bind = "10.0.0.99" }, false},
		{"ingress removed", func(_ *testing.T, in *Inputs) { in.Sidecars[0].Spec.Ingress = in.Sidecars[0].Spec.Ingress[:1] }, false},
		{"egress claims an ingress address", func(_ *testing.T, in *Inputs) {
			in.Sidecars[0].Spec.Egress[1].Bind = "10.0.0.10"
			in.Sidecars[0].Spec.Egress[1].Port = &networkingv1alpha3.SidecarPort{Number: 8080, Protocol: "HTTP", Name: "x"}
		}, false},
		// The name is only in error messages.
		{"Sidecar renamed", func(_ *testing.T, in *Inputs) { in.Sidecars[0].Name = "other" }, false},
		{"PeerAuthentication mode", func(_ *testing.T, in *Inputs) {
			in.PeerAuthentications[0].Spec.Mtls.Mode = securityv1beta1.PeerAuthentication_MutualTLS_PERMISSIVE
		}, false},
		{"PeerAuthentication port mode", func(_ *testing.T, in *Inputs) {
			in.PeerAuthentications[0].Spec.Selector = &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": "db"}}
			in.PeerAuthentications[0].Spec.PortLevelMtls = map[uint32]*securityv1beta1.PeerAuthentication_MutualTLS{
				9000: {Mode: securityv1beta1.PeerAuthentication_MutualTLS_DISABLE}}
		}, false},
		{"AuthorizationPolicy principal", func(_ *testing.T, in *Inputs) {
			in.AuthorizationPolicies[0].Spec.Rules[0].From[0].Source.Principals[0] = "cluster.local/ns/shop/sa/api"
		}, false},
		{"AuthorizationPolicy removed", func(_ *testing.T, in *Inputs) { in.AuthorizationPolicies = nil }, false},
		// The policies here name no trust domain.
		{"trust domain", func(_ *testing.T, in *Inputs) { in.Mesh.TrustDomain = "example.org" }, false},
	}
	// Changes the digest notices although no workload's own resources
	// change with them here.
	conservative := map[string]bool{"Sidecar renamed": true, "trust domain": true}
	before := base(t)
	prepared := Prepare(before)
	want, ok := prepared.OwnInputs(before.Workload)
	if !ok {
		t.Fatal("OwnInputs of the base inputs not taken")
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			after := base(t)
			tc.change(t, after)
			s := Prepare(after)
			got, ok := s.OwnInputs(before.Workload)
			if !ok {
				t.Fatal("OwnInputs not taken")
			}
			if kept := got.Equal(want); kept != tc.keeps {
				t.Fatalf("OwnInputs kept = %v, want %v", kept, tc.keeps)
			}
			// The property callers rely on: equal digests, equal own
			// results, for every workload of the scope.
			ownDiffers := false
			for _, w := range variants(before) {
				in := *before
				in.Workload = w
				if ScopeKey(&in) != ScopeKey(before) {
					continue
				}
				_, ownBefore, errBefore := prepared.For(w)
				_, ownAfter, errAfter := s.For(w)
				a, b := render(t, ownBefore, errBefore), render(t, ownAfter, errAfter)
				dBefore, _ := prepared.OwnInputs(w)
				dAfter, _ := s.OwnInputs(w)
				if dBefore.Equal(dAfter) && !bytes.Equal(a, b) {
					t.Fatalf("OwnInputs equal but %+v's own resources differ at %s", w, firstDiff(a, b))
				}
				ownDiffers = ownDiffers || !bytes.Equal(a, b)
			}
			if !tc.keeps && !ownDiffers && !conservative[tc.name] {
				t.Errorf("the change leaves every workload's own resources as they were: the case tests nothing")
			}
		})
	}
}
