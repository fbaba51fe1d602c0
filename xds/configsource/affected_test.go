package configsource

import (
	"context"
	"testing"

	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istiosecurityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// tableExports answers from maps.
type tableExports struct {
	services   map[string][]string   // "ns/name" -> exportTo
	namespaces map[string][][]string // ns -> exportTo of its Services and ServiceEntries
}

func (e tableExports) serviceExportTo(_ context.Context, ns, name string) ([]string, bool) {
	v, ok := e.services[ns+"/"+name]
	return v, ok
}

func (e tableExports) namespaceExportTo(_ context.Context, ns string) [][]string {
	return e.namespaces[ns]
}

func sidecar(ns, name string, selector map[string]string) *istionetworkingv1.Sidecar {
	sc := &istionetworkingv1.Sidecar{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if selector != nil {
		sc.Spec.WorkloadSelector = &istioapi.WorkloadSelector{Labels: selector}
	}
	return sc
}

func exportedService(ns, name, exportTo string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if exportTo != "" {
		s.Annotations = map[string]string{"networking.istio.io/exportTo": exportTo}
	}
	return s
}

func serviceEntry(ns string, exportTo ...string) *istionetworkingv1.ServiceEntry {
	se := &istionetworkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ext"}}
	se.Spec.ExportTo = exportTo
	return se
}

func TestAffectedWorkloads(t *testing.T) {
	// Workloads: ratings (app=ratings) and reviews (app=reviews) in bookinfo,
	// db (app=db) in data.
	workloads := map[types.NamespacedName]map[string]string{
		{Namespace: "bookinfo", Name: "ratings-1"}: {"app": "ratings", "class": "vm"},
		{Namespace: "bookinfo", Name: "reviews-1"}: {"app": "reviews"},
		{Namespace: "data", Name: "db-1"}:          {"app": "db"},
	}
	ex := tableExports{
		services: map[string][]string{"bookinfo/details": nil, "data/db": {"."}},
		namespaces: map[string][][]string{
			"bookinfo": {nil},
			"data":     {{"."}, {"data", "bookinfo"}},
			"private":  {{"~"}},
		},
	}
	slice := func(ns, svc string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: svc + "-abc", Labels: map[string]string{discoveryv1.LabelServiceName: svc}}}
	}
	we := func(ns string) *istionetworkingv1.WorkloadEntry {
		return &istionetworkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm"}}
	}
	all := []string{"bookinfo/ratings-1", "bookinfo/reviews-1", "data/db-1"}
	tests := []struct {
		name     string
		old, new client.Object
		want     []string
	}{
		{name: "root namespace Sidecar: everyone", new: sidecar("istio-system", "default", nil), want: all},
		{name: "namespace Sidecar: its namespace", new: sidecar("bookinfo", "default", nil), want: []string{"bookinfo/ratings-1", "bookinfo/reviews-1"}},
		{name: "selector Sidecar: what it selects", new: sidecar("bookinfo", "ratings", map[string]string{"app": "ratings"}), want: []string{"bookinfo/ratings-1"}},
		{name: "selector Sidecar changed: old and new selection", old: sidecar("bookinfo", "s", map[string]string{"app": "ratings"}), new: sidecar("bookinfo", "s", map[string]string{"app": "reviews"}), want: []string{"bookinfo/ratings-1", "bookinfo/reviews-1"}},
		{name: "selector Sidecar deleted", old: sidecar("data", "s", map[string]string{"app": "db"}), want: []string{"data/db-1"}},
		{name: "selector Sidecar matching nobody", new: sidecar("bookinfo", "s", map[string]string{"app": "nobody"}), want: nil},
		{name: "Service exported everywhere (default)", new: exportedService("data", "db", ""), want: all},
		{name: "Service exported to its namespace", new: exportedService("data", "db", "."), want: []string{"data/db-1"}},
		{name: "Service exported to a list", new: exportedService("other", "x", "bookinfo, data"), want: all},
		{name: "Service made private: who saw it before", old: exportedService("data", "db", "bookinfo"), new: exportedService("data", "db", "~"), want: []string{"bookinfo/ratings-1", "bookinfo/reviews-1"}},
		{name: "ServiceEntry exported to its namespace", new: serviceEntry("bookinfo", "."), want: []string{"bookinfo/ratings-1", "bookinfo/reviews-1"}},
		{name: "ServiceEntry default export", old: serviceEntry("other"), want: all},
		{name: "EndpointSlice follows its Service", new: slice("data", "db"), want: []string{"data/db-1"}},
		{name: "EndpointSlice of an unknown Service: its namespace", new: slice("data", "gone"), want: []string{"data/db-1"}},
		{name: "WorkloadEntry: exports of its namespace", new: we("data"), want: all},
		{name: "WorkloadEntry of a private namespace", new: we("private"), want: nil},
		{name: "registration: that workload", new: &runtimev1alpha1.WorkloadAutoRegistration{ObjectMeta: metav1.ObjectMeta{Namespace: "data", Name: "db-1"}}, want: []string{"data/db-1"}},
		{name: "root PeerAuthentication: everyone", new: &istiosecurityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "default"}}, want: all},
		{name: "namespace PeerAuthentication: its namespace", old: &istiosecurityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{Namespace: "data", Name: "strict"}}, want: []string{"data/db-1"}},
		{name: "unknown kind: everyone", new: &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "y"}}, want: all},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := newScope()
			c := change{}
			if tt.old != nil {
				c.old = tt.old
			}
			if tt.new != nil {
				c.new = tt.new
			}
			sc.affected(t.Context(), c, "istio-system", ex)
			var got []string
			for _, key := range all {
				k := types.NamespacedName{}
				for w := range workloads {
					if w.String() == key {
						k = w
					}
				}
				if sc.includes(k, func() map[string]string { return workloads[k] }) {
					got = append(got, key)
				}
			}
			if len(got) != len(tt.want) {
				t.Fatalf("affected %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("affected %v, want %v", got, tt.want)
				}
			}
		})
	}
}

func TestUnknownLabelsAreInScope(t *testing.T) {
	sc := newScope()
	sc.affected(t.Context(), change{new: sidecar("bookinfo", "s", map[string]string{"app": "x"})}, "istio-system", tableExports{})
	if !sc.includes(types.NamespacedName{Namespace: "bookinfo", Name: "w"}, func() map[string]string { return nil }) {
		t.Error("a workload whose labels are unknown must be recomputed")
	}
	if sc.includes(types.NamespacedName{Namespace: "other", Name: "w"}, func() map[string]string { return nil }) {
		t.Error("a selector of bookinfo includes a workload of another namespace")
	}
}
