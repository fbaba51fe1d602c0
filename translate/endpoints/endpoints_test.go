package endpoints

import (
	"fmt"
	"slices"
	"testing"

	metav1alpha1 "istio.io/api/meta/v1alpha1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
)

func TestWorkloadEntryHealth(t *testing.T) {
	tests := []struct {
		name        string
		annotations map[string]string
		condition   string // "" means no Healthy condition
		want        bool
	}{
		{name: "no condition", want: true},
		{name: "healthy", condition: "True", want: true},
		{name: "unhealthy", condition: "False", want: false},
		{name: "checks enabled, not reported yet", annotations: map[string]string{HealthChecksAnnotation: "true"}, want: false},
		{name: "checks enabled, healthy", annotations: map[string]string{HealthChecksAnnotation: "true"}, condition: "True", want: true},
		{name: "checks enabled, unhealthy", annotations: map[string]string{HealthChecksAnnotation: "true"}, condition: "False", want: false},
		{name: "checks disabled explicitly", annotations: map[string]string{HealthChecksAnnotation: "false"}, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			we := &istionetworkingv1.WorkloadEntry{}
			we.Annotations = tt.annotations
			if tt.condition != "" {
				we.Status.Conditions = append(we.Status.Conditions, &metav1alpha1.IstioCondition{Type: HealthyCondition, Status: tt.condition})
			}
			if got := Healthy(we); got != tt.want {
				t.Errorf("Healthy = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestLoadAssignmentSortsAndDeduplicates(t *testing.T) {
	tests := []struct {
		name string
		eps  []Endpoint
		want []string // "<addr>:<port>/<weight>"
	}{
		{name: "none"},
		{name: "sorted by address, then port", eps: []Endpoint{{Addr: "10.0.0.2", Port: 80}, {Addr: "10.0.0.1", Port: 90}, {Addr: "10.0.0.1", Port: 80}},
			want: []string{"10.0.0.1:80/0", "10.0.0.1:90/0", "10.0.0.2:80/0"}},
		{name: "a duplicate address and port once, the lowest weight kept whatever the order",
			eps:  []Endpoint{{Addr: "10.0.0.1", Port: 80, Weight: 5}, {Addr: "10.0.0.2", Port: 80}, {Addr: "10.0.0.1", Port: 80, Weight: 2}},
			want: []string{"10.0.0.1:80/2", "10.0.0.2:80/0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cla := LoadAssignment("c", tt.eps)
			var got []string
			for _, l := range cla.GetEndpoints() {
				for _, e := range l.GetLbEndpoints() {
					a := e.GetEndpoint().GetAddress().GetSocketAddress()
					got = append(got, fmt.Sprintf("%s:%d/%d", a.GetAddress(), a.GetPortValue(), e.GetLoadBalancingWeight().GetValue()))
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("endpoints %v, want %v", got, tt.want)
			}
		})
	}
}

// TestIndexRemembersEachPort: a port's endpoints are computed once per
// version of the Service (its resourceVersion; a copy of the same version
// is the same Service); callers own what they get (sorting it changes
// nothing for the next); another version, or an object without one, is
// computed anew.
func TestIndexRemembersEachPort(t *testing.T) {
	we := func(name, addr, app string) *istionetworkingv1.WorkloadEntry {
		w := &istionetworkingv1.WorkloadEntry{}
		w.Name, w.Namespace = name, "shop"
		w.Spec.Address, w.Spec.Labels = addr, map[string]string{"app": app}
		return w
	}
	x := NewIndex(nil, nil, []*istionetworkingv1.WorkloadEntry{we("b", "10.0.0.2", "reviews"), we("a", "10.0.0.1", "reviews"), we("c", "10.0.0.3", "ratings")})
	svc := &corev1.Service{}
	svc.Name, svc.Namespace, svc.UID, svc.ResourceVersion = "reviews", "shop", "u1", "1"
	svc.Spec.Selector = map[string]string{"app": "reviews"}
	svc.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 8080}}
	addrs := func(eps []Endpoint) []string {
		var out []string
		for _, e := range eps {
			out = append(out, e.Addr)
		}
		return out
	}
	reviews, ratings := []string{"10.0.0.2", "10.0.0.1"}, []string{"10.0.0.3"}
	first := x.OfService(svc, svc.Spec.Ports[0])
	if got := addrs(first); !slices.Equal(got, reviews) {
		t.Fatalf("endpoints %v, want the two reviews entries in index order", got)
	}
	LoadAssignment("c", first) // sorts the caller's slice in place
	if got := addrs(x.OfService(svc, svc.Spec.Ports[0])); !slices.Equal(got, reviews) {
		t.Errorf("after the caller sorted its copy: %v, want the remembered order", got)
	}
	// Only the version names the Service: a copy claiming version 1 with
	// another selector gets what version 1 selected (never the case for
	// objects read from the API server, where a change is a new version).
	sameVersion := svc.DeepCopy()
	sameVersion.Spec.Selector = map[string]string{"app": "ratings"}
	if got := addrs(x.OfService(sameVersion, sameVersion.Spec.Ports[0])); !slices.Equal(got, reviews) {
		t.Errorf("the same version again: %v, want the remembered %v", got, reviews)
	}
	next := sameVersion.DeepCopy()
	next.ResourceVersion = "2"
	if got := addrs(x.OfService(next, next.Spec.Ports[0])); !slices.Equal(got, ratings) {
		t.Errorf("a new version: %v, want its own selection %v", got, ratings)
	}
	unversioned := sameVersion.DeepCopy()
	unversioned.ResourceVersion = ""
	if got := addrs(x.OfService(unversioned, unversioned.Spec.Ports[0])); !slices.Equal(got, ratings) {
		t.Errorf("no version: %v, want its own selection %v", got, ratings)
	}
}
