package translate

import (
	"testing"
	"time"

	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
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
