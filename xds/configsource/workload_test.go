package configsource

import (
	"testing"

	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/xds"
)

// registrationOf is a registration of group with the workload's own labels.
func registrationOf(t *testing.T, group *istionetworkingv1.WorkloadGroup, own map[string]string) *runtimev1alpha1.WorkloadAutoRegistration {
	t.Helper()
	snap, err := registry.Snapshot(group)
	if err != nil {
		t.Fatal(err)
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{ObjectMeta: metav1.ObjectMeta{Name: "ratings-1", Namespace: "bookinfo"}}
	war.Spec.WorkloadGroup = snap
	war.Spec.Registration.Host.Addresses = []runtimev1alpha1.HostAddress{{IP: "10.0.0.1", Type: runtimev1alpha1.AddressTypeVPC}}
	war.Spec.Registration.Workload.Labels = own
	return war
}

// TestWorkloadOfIsReadOncePerRegistration: a node's workload labels are
// decoded from its registration once and reused while the proxy holds the
// same registration object; another object (the registration read again)
// is decoded again; a broken one reports its error; Forget drops the node.
func TestWorkloadOfIsReadOncePerRegistration(t *testing.T) {
	group := &istionetworkingv1.WorkloadGroup{ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: "bookinfo"}}
	group.Spec.Template = &istioapi.WorkloadEntry{Labels: map[string]string{"app": "ratings"}, ServiceAccount: "ratings-vm"}
	s := &Source{served: map[string]*served{}, workloads: map[string]*workloadOf{}}
	p := &xds.Proxy{NodeID: "sidecar~10.0.0.1~ratings-1.bookinfo~bookinfo.svc.cluster.local", Registration: registrationOf(t, group, map[string]string{"version": "v1"})}

	first := s.workloadOf(p)
	if first.err != nil || first.sa != "ratings-vm" || first.labels["app"] != "ratings" || first.labels["version"] != "v1" {
		t.Fatalf("workloadOf = %+v, want the template's and the workload's labels and ratings-vm", first)
	}
	if again := s.workloadOf(p); again != first {
		t.Errorf("the same registration object was decoded again")
	}

	p2 := *p
	p2.Registration = registrationOf(t, group, map[string]string{"version": "v2"})
	if got := s.workloadOf(&p2); got == first || got.labels["version"] != "v2" {
		t.Errorf("after the registration changed, labels = %v, want version v2 (decoded again)", got.labels)
	}

	p3 := *p
	p3.Registration = p.Registration.DeepCopy()
	p3.Registration.Spec.Registration.Host.Addresses = nil
	if got := s.workloadOf(&p3); got.err == nil {
		t.Errorf("a registration without an address: no error")
	}

	s.Forget(p.NodeID)
	if _, ok := s.workloads[p.NodeID]; ok {
		t.Errorf("Forget left the node's workload")
	}
}
