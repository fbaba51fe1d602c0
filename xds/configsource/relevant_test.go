package configsource

import (
	"testing"

	istiometa "istio.io/api/meta/v1alpha1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

func TestRelevantUpdates(t *testing.T) {
	we := func(mut func(*istionetworkingv1.WorkloadEntry)) client.Object {
		w := &istionetworkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", Generation: 1, Labels: map[string]string{"app": "ratings"}}}
		w.Spec.Address = "10.0.0.1"
		if mut != nil {
			mut(w)
		}
		return w
	}
	war := func(gen int64, status string) client.Object {
		w := &runtimev1alpha1.WorkloadAutoRegistration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", Generation: gen}}
		w.Status.Conditions = []metav1.Condition{{Type: "AgentConnected", Status: metav1.ConditionStatus(status)}}
		return w
	}
	svc := func(mut func(*corev1.Service)) client.Object {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "details"}}
		s.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 8080}}
		if mut != nil {
			mut(s)
		}
		return s
	}
	slice := func(ready bool) client.Object {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "details-abc"},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}}}
	}
	tests := []struct {
		name     string
		old, new client.Object
		want     bool
	}{
		{name: "WorkloadEntry connection annotation", old: we(nil), new: we(func(w *istionetworkingv1.WorkloadEntry) {
			w.Annotations = map[string]string{"istio.io/connectedAt": "now"}
		}), want: false},
		{name: "WorkloadEntry spec (new generation)", old: we(nil), new: we(func(w *istionetworkingv1.WorkloadEntry) { w.Generation = 2; w.Spec.Address = "10.0.0.2" }), want: true},
		{name: "WorkloadEntry labels", old: we(nil), new: we(func(w *istionetworkingv1.WorkloadEntry) { w.Labels = map[string]string{"app": "other"} }), want: true},
		{name: "WorkloadEntry health", old: we(nil), new: we(func(w *istionetworkingv1.WorkloadEntry) {
			w.Status.Conditions = []*istiometa.IstioCondition{{Type: "Healthy", Status: "False"}}
		}), want: true},
		{name: "WorkloadEntry health checks enabled", old: we(nil), new: we(func(w *istionetworkingv1.WorkloadEntry) {
			w.Annotations = map[string]string{"proxy.istio.io/health-checks-enabled": "true"}
		}), want: true},
		{name: "registration status", old: war(1, "False"), new: war(1, "True"), want: false},
		{name: "registration spec", old: war(1, "True"), new: war(2, "True"), want: true},
		{name: "Service annotation other than exportTo", old: svc(nil), new: svc(func(s *corev1.Service) { s.Annotations = map[string]string{"x": "y"} }), want: false},
		{name: "Service exportTo", old: svc(nil), new: svc(func(s *corev1.Service) { s.Annotations = map[string]string{"networking.istio.io/exportTo": "."} }), want: true},
		{name: "Service port", old: svc(nil), new: svc(func(s *corev1.Service) { s.Spec.Ports[0].Port = 9080 }), want: true},
		{name: "EndpointSlice readiness", old: slice(true), new: slice(false), want: true},
		{name: "EndpointSlice unchanged", old: slice(true), new: slice(true), want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := relevant(tt.old, tt.new); got != tt.want {
				t.Errorf("relevant = %v, want %v", got, tt.want)
			}
		})
	}
}
