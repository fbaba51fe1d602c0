package presence

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
)

// A group's connection series go when its last workload disconnects: the
// gauge at once, the counters after the retention, unless a workload of
// the group connected again.
func TestConnectionMetricsForgetEmptyGroups(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewConnectionMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.counterRetention = 10 * time.Millisecond
	w := func(ns, name, group string) registry.StreamWorkload {
		return registry.StreamWorkload{Key: types.NamespacedName{Namespace: ns, Name: name}, Group: group}
	}
	a, b, c := w("bookinfo", "a", "ratings"), w("bookinfo", "b", "ratings"), w("shop", "c", "cart")
	m.opened(a)
	m.opened(b)
	m.opened(c)
	m.closed(a)
	want := `# HELP embark_xds_connected_workloads Workloads whose sidecar holds at least one ADS stream to this replica.
# TYPE embark_xds_connected_workloads gauge
embark_xds_connected_workloads{group="cart",workload_namespace="shop"} 1
embark_xds_connected_workloads{group="ratings",workload_namespace="bookinfo"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "embark_xds_connected_workloads"); err != nil {
		t.Error(err)
	}
	m.closed(b)
	want = `# HELP embark_xds_connected_workloads Workloads whose sidecar holds at least one ADS stream to this replica.
# TYPE embark_xds_connected_workloads gauge
embark_xds_connected_workloads{group="cart",workload_namespace="shop"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "embark_xds_connected_workloads"); err != nil {
		t.Error(err)
	}
	// The counters of the emptied group go after the retention; shop's stay.
	err = wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return testutil.CollectAndCount(m.disconnects) == 0 && testutil.CollectAndCount(m.connects) == 1, nil
	})
	if err != nil {
		t.Errorf("disconnects series = %d, connects series = %d; want 0 and 1 (shop/cart)",
			testutil.CollectAndCount(m.disconnects), testutil.CollectAndCount(m.connects))
	}
}

// With FleetFromLeader, only the leading replica reports the fleet gauge:
// two replicas reading the same cache do not double a sum.
func TestWorkloadsGaugeFromLeaderOnly(t *testing.T) {
	tests := []struct {
		name      string
		opts      []HealthMetricsOption
		wantCount int
	}{
		{name: "no leader option: always", wantCount: 1},
		{name: "leader", opts: []HealthMetricsOption{FleetFromLeader(func() bool { return true })}, wantCount: 1},
		{name: "follower", opts: []HealthMetricsOption{FleetFromLeader(func() bool { return false })}, wantCount: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			if _, err := NewHealthMetrics(reg, oneEntryReader{}, tc.opts...); err != nil {
				t.Fatal(err)
			}
			n, err := testutil.GatherAndCount(reg, "embark_registry_workloads")
			if err != nil {
				t.Fatal(err)
			}
			if n != tc.wantCount {
				t.Errorf("embark_registry_workloads series = %d, want %d", n, tc.wantCount)
			}
		})
	}
}

// oneEntryReader lists one WorkloadEntry owned by a registration: the
// collector's input, without the API server (what the cache holds is not
// under test here; health_test.go counts from the real informer cache).
type oneEntryReader struct{ client.Reader }

func (oneEntryReader) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	l, ok := list.(*istionetworkingv1.WorkloadEntryList)
	if !ok {
		return fmt.Errorf("unexpected list %T", list)
	}
	l.Items = []*istionetworkingv1.WorkloadEntry{{ObjectMeta: metav1.ObjectMeta{
		Namespace: "bookinfo", Name: "ratings-1",
		Annotations: map[string]string{registry.AnnotationWorkloadGroup: "ratings"},
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion: runtimev1alpha1.SchemeGroupVersion.String(), Kind: "WorkloadAutoRegistration",
			Name: "ratings-1", Controller: ptr.To(true),
		}},
	}}}
	return nil
}
