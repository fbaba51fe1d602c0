package translate

import (
	"testing"
	"time"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	securityv1beta1 "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istiosecurityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func sidecar(ns, name string, age int, sel map[string]string) *istionetworkingv1.Sidecar {
	sc := &istionetworkingv1.Sidecar{ObjectMeta: metav1.ObjectMeta{
		Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Minute)),
	}}
	if sel != nil {
		sc.Spec.WorkloadSelector = &networkingv1alpha3.WorkloadSelector{Labels: sel}
	}
	return sc
}

func TestSelectSidecar(t *testing.T) {
	w := Workload{Name: "vm", Namespace: "bookinfo", Labels: map[string]string{"app": "ratings", "class": "vm"}}
	match := map[string]string{"app": "ratings"}
	tests := []struct {
		name     string
		sidecars []*istionetworkingv1.Sidecar
		want     string // "" means no Sidecar applies
	}{
		{name: "none", want: ""},
		{name: "selector beats namespace default", sidecars: []*istionetworkingv1.Sidecar{
			sidecar("bookinfo", "ns-default", 0, nil),
			sidecar("bookinfo", "selected", 5, match),
			sidecar("istio-system", "root", 0, nil),
		}, want: "bookinfo/selected"},
		{name: "all selector labels must match", sidecars: []*istionetworkingv1.Sidecar{
			sidecar("bookinfo", "pods-only", 0, map[string]string{"app": "ratings", "class": "pod"}),
			sidecar("bookinfo", "ns-default", 1, nil),
		}, want: "bookinfo/ns-default"},
		{name: "selector in another namespace ignored", sidecars: []*istionetworkingv1.Sidecar{
			sidecar("other", "selected", 0, match),
			sidecar("istio-system", "root", 0, nil),
		}, want: "istio-system/root"},
		{name: "namespace default beats root", sidecars: []*istionetworkingv1.Sidecar{
			sidecar("istio-system", "root", 0, nil),
			sidecar("bookinfo", "ns-default", 9, nil),
		}, want: "bookinfo/ns-default"},
		{name: "root selector sidecar does not apply", sidecars: []*istionetworkingv1.Sidecar{
			sidecar("istio-system", "root-sel", 0, match),
		}, want: ""},
		{name: "oldest of two matching selectors", sidecars: []*istionetworkingv1.Sidecar{
			sidecar("bookinfo", "a-newer", 2, match),
			sidecar("bookinfo", "b-older", 1, map[string]string{"class": "vm"}),
		}, want: "bookinfo/b-older"},
		{name: "same age: first by name", sidecars: []*istionetworkingv1.Sidecar{
			sidecar("bookinfo", "zeta", 1, match),
			sidecar("bookinfo", "alpha", 1, match),
		}, want: "bookinfo/alpha"},
		{name: "oldest of two namespace defaults", sidecars: []*istionetworkingv1.Sidecar{
			sidecar("bookinfo", "a", 3, nil),
			sidecar("bookinfo", "b", 2, nil),
		}, want: "bookinfo/b"},
		{name: "nil entries skipped", sidecars: []*istionetworkingv1.Sidecar{nil, sidecar("bookinfo", "x", 0, nil)}, want: "bookinfo/x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := selectSidecar(tt.sidecars, w, DefaultRootNamespace)
			name := ""
			if got != nil {
				name = got.Namespace + "/" + got.Name
			}
			if name != tt.want {
				t.Errorf("selected %q, want %q", name, tt.want)
			}
			// Translate reports the same choice.
			res, err := Translate(&Inputs{Workload: w, Sidecars: tt.sidecars})
			if err != nil {
				t.Fatal(err)
			}
			if (res.Sidecar == nil) != (tt.want == "") || (res.Sidecar != nil && res.Sidecar.Namespace+"/"+res.Sidecar.Name != tt.want) {
				t.Errorf("Result.Sidecar = %v, want %q", res.Sidecar, tt.want)
			}
		})
	}
}

func peerAuth(ns, name string, age int, sel map[string]string, mode securityv1beta1.PeerAuthentication_MutualTLS_Mode, ports map[uint32]securityv1beta1.PeerAuthentication_MutualTLS_Mode) *istiosecurityv1.PeerAuthentication {
	pa := &istiosecurityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{
		Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Minute)),
	}}
	pa.Spec.Mtls = &securityv1beta1.PeerAuthentication_MutualTLS{Mode: mode}
	if sel != nil {
		pa.Spec.Selector = &typev1beta1.WorkloadSelector{MatchLabels: sel}
	}
	for p, m := range ports {
		if pa.Spec.PortLevelMtls == nil {
			pa.Spec.PortLevelMtls = map[uint32]*securityv1beta1.PeerAuthentication_MutualTLS{}
		}
		pa.Spec.PortLevelMtls[p] = &securityv1beta1.PeerAuthentication_MutualTLS{Mode: m}
	}
	return pa
}

func TestPeerAuthMode(t *testing.T) {
	const (
		unset      = securityv1beta1.PeerAuthentication_MutualTLS_UNSET
		strict     = securityv1beta1.PeerAuthentication_MutualTLS_STRICT
		permissive = securityv1beta1.PeerAuthentication_MutualTLS_PERMISSIVE
		disable    = securityv1beta1.PeerAuthentication_MutualTLS_DISABLE
	)
	w := Workload{Namespace: "shop", Labels: map[string]string{"app": "api"}}
	sel := map[string]string{"app": "api"}
	tests := []struct {
		name string
		pas  []*istiosecurityv1.PeerAuthentication
		port uint32
		want MTLSMode
	}{
		{name: "default permissive", want: MTLSPermissive},
		{name: "mesh strict", pas: []*istiosecurityv1.PeerAuthentication{peerAuth("istio-system", "default", 0, nil, strict, nil)}, want: MTLSStrict},
		{name: "namespace overrides mesh", pas: []*istiosecurityv1.PeerAuthentication{
			peerAuth("istio-system", "default", 0, nil, strict, nil),
			peerAuth("shop", "default", 0, nil, permissive, nil),
		}, want: MTLSPermissive},
		{name: "namespace unset inherits mesh", pas: []*istiosecurityv1.PeerAuthentication{
			peerAuth("istio-system", "default", 0, nil, strict, nil),
			peerAuth("shop", "default", 0, nil, unset, nil),
		}, want: MTLSStrict},
		{name: "selector overrides namespace", pas: []*istiosecurityv1.PeerAuthentication{
			peerAuth("shop", "default", 0, nil, permissive, nil),
			peerAuth("shop", "api", 0, sel, strict, nil),
		}, want: MTLSStrict},
		{name: "port level beats workload level", port: 7000, pas: []*istiosecurityv1.PeerAuthentication{
			peerAuth("shop", "api", 0, sel, strict, map[uint32]securityv1beta1.PeerAuthentication_MutualTLS_Mode{7000: disable}),
		}, want: MTLSDisable},
		{name: "port level for another port", port: 8080, pas: []*istiosecurityv1.PeerAuthentication{
			peerAuth("shop", "api", 0, sel, strict, map[uint32]securityv1beta1.PeerAuthentication_MutualTLS_Mode{7000: disable}),
		}, want: MTLSStrict},
		{name: "selector that does not match", pas: []*istiosecurityv1.PeerAuthentication{
			peerAuth("shop", "web", 0, map[string]string{"app": "web"}, strict, nil),
		}, want: MTLSPermissive},
		{name: "selector in root namespace ignored", pas: []*istiosecurityv1.PeerAuthentication{
			peerAuth("istio-system", "api", 0, sel, strict, nil),
		}, want: MTLSPermissive},
		{name: "oldest selector wins", pas: []*istiosecurityv1.PeerAuthentication{
			peerAuth("shop", "new", 5, sel, strict, nil),
			peerAuth("shop", "old", 1, sel, disable, nil),
		}, want: MTLSDisable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := peerAuthMode(tt.pas, w, DefaultRootNamespace, tt.port); got != tt.want {
				t.Errorf("mode %s, want %s", got, tt.want)
			}
		})
	}
}
