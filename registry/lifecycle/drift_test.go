package lifecycle

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	istioapi "istio.io/api/networking/v1alpha3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/fixtures"
)

func TestSpecDiff(t *testing.T) {
	base := func() *istioapi.WorkloadGroup {
		return &istioapi.WorkloadGroup{
			Metadata: &istioapi.WorkloadGroup_ObjectMeta{Labels: map[string]string{"app": "ratings"}},
			Template: &istioapi.WorkloadEntry{
				Labels: map[string]string{"app": "ratings", "class": "vm"}, ServiceAccount: "ratings-vm",
				Network: "virtual-machines", Ports: map[string]uint32{"http": 8080},
			},
		}
	}
	tests := []struct {
		name   string
		mutate func(*istioapi.WorkloadGroup)
		want   []string
	}{
		{name: "equal", mutate: func(*istioapi.WorkloadGroup) {}},
		{name: "map order does not matter", mutate: func(g *istioapi.WorkloadGroup) {
			g.Template.Labels = map[string]string{"class": "vm", "app": "ratings"}
		}},
		{name: "unset equals empty", mutate: func(g *istioapi.WorkloadGroup) { g.Probe = &istioapi.ReadinessProbe{} }},
		{name: "service account", mutate: func(g *istioapi.WorkloadGroup) { g.Template.ServiceAccount = "ratings-v2" }, want: []string{"template.serviceAccount"}},
		{name: "template labels and ports", mutate: func(g *istioapi.WorkloadGroup) {
			g.Template.Labels["version"] = "v2"
			g.Template.Ports = nil
		}, want: []string{"template.labels", "template.ports"}},
		{name: "probe added", mutate: func(g *istioapi.WorkloadGroup) {
			g.Probe = &istioapi.ReadinessProbe{PeriodSeconds: 5}
		}, want: []string{"probe.periodSeconds"}},
		{name: "metadata annotations", mutate: func(g *istioapi.WorkloadGroup) {
			g.Metadata.Annotations = map[string]string{"a": "b"}
		}, want: []string{"metadata.annotations"}},
		{name: "template removed", mutate: func(g *istioapi.WorkloadGroup) { g.Template = nil },
			want: []string{"template.labels", "template.network", "template.ports", "template.serviceAccount"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cur := base()
			tt.mutate(cur)
			if got := SpecDiff(base(), cur); !slices.Equal(got, tt.want) {
				t.Errorf("SpecDiff = %v, want %v", got, tt.want)
			}
			if got := SpecDiff(cur, base()); !slices.Equal(got, tt.want) {
				t.Errorf("SpecDiff reversed = %v, want %v", got, tt.want)
			}
		})
	}
}

// waitCondition waits until war's condition of type typ has status and
// reason, and returns the registration.
func waitCondition(t *testing.T, war *runtimev1alpha1.WorkloadAutoRegistration, typ string, status metav1.ConditionStatus, reason string) *runtimev1alpha1.WorkloadAutoRegistration {
	t.Helper()
	cur := &runtimev1alpha1.WorkloadAutoRegistration{}
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(war), cur); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(cur.Status.Conditions, typ)
		return c != nil && c.Status == status && c.Reason == reason, nil
	})
	if err != nil {
		t.Fatalf("%s never had %s=%s (%s): %v; conditions %+v", war.Name, typ, status, reason, err, cur.Status.Conditions)
	}
	return cur
}

func updateGroup(t *testing.T, wg *istionetworkingv1.WorkloadGroup, mutate func(*istionetworkingv1.WorkloadGroup)) *istionetworkingv1.WorkloadGroup {
	t.Helper()
	cur := &istionetworkingv1.WorkloadGroup{}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(wg), cur); err != nil {
			return err
		}
		mutate(cur)
		return env.Client.Update(t.Context(), cur)
	})
	if err != nil {
		t.Fatal(err)
	}
	return cur
}

func TestWorkloadGroupDriftCondition(t *testing.T) {
	ns := env.Namespace(t)
	wg := lifecycleGroup(t, ns)
	war, _ := createRegistration(t, wg, 1)
	// One worker: registrations are reconciled in the order they are queued.
	h := startLifecycle(t, ns, "replica-a", func(o *Options) { o.GracePeriod = time.Hour; o.Workers = 1 })

	waitCondition(t, war, runtimev1alpha1.ConditionWorkloadGroupOutOfDate, metav1.ConditionFalse, ReasonUpToDate)

	// The template changes: True, naming the field and the generations.
	changed := updateGroup(t, wg, func(g *istionetworkingv1.WorkloadGroup) { g.Spec.Template.ServiceAccount = "ratings-v2" })
	cur := waitCondition(t, war, runtimev1alpha1.ConditionWorkloadGroupOutOfDate, metav1.ConditionTrue, ReasonWorkloadGroupChanged)
	msg := meta.FindStatusCondition(cur.Status.Conditions, runtimev1alpha1.ConditionWorkloadGroupOutOfDate).Message
	for _, want := range []string{"template.serviceAccount", "snapshot generation 1", "current generation 2", "kubectl delete war " + war.Name} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "template.labels") {
		t.Errorf("message %q names a field that did not change", msg)
	}
	if changed.Generation != 2 {
		t.Fatalf("group generation = %d, want 2", changed.Generation)
	}

	// Changed back: False again, although the generation moved on.
	updateGroup(t, wg, func(g *istionetworkingv1.WorkloadGroup) { g.Spec.Template.ServiceAccount = "ratings-vm" })
	cur = waitCondition(t, war, runtimev1alpha1.ConditionWorkloadGroupOutOfDate, metav1.ConditionFalse, ReasonUpToDate)
	// The counter moves just after the write the condition shows.
	fixtures.Eventually(t, 10*time.Second, "the third drift write counted", func() bool {
		return metricValue(t, h.reg, "embark_registry_workloadgroup_out_of_date_writes_total", "") >= 3
	})
	writes := metricValue(t, h.reg, "embark_registry_workloadgroup_out_of_date_writes_total", "")

	// A new label on the group's metadata is no spec change: nothing is
	// written. A registration created after the label change is reconciled
	// after the group's event, so once it has its condition the first one
	// has been looked at again.
	labelled := updateGroup(t, wg, func(g *istionetworkingv1.WorkloadGroup) { g.Labels = map[string]string{"team": "ratings"} })
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		seen := &istionetworkingv1.WorkloadGroup{}
		if err := h.cache.Get(ctx, client.ObjectKeyFromObject(wg), seen); err != nil {
			return false, err
		}
		return seen.ResourceVersion == labelled.ResourceVersion, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	later, _ := createRegistration(t, labelled, 2)
	waitCondition(t, later, runtimev1alpha1.ConditionWorkloadGroupOutOfDate, metav1.ConditionFalse, ReasonUpToDate)
	after := getRegistration(t, war)
	if after.ResourceVersion != cur.ResourceVersion {
		t.Errorf("registration rewritten after a metadata-only group change: %+v", after.Status.Conditions)
	}
	if got := metricValue(t, h.reg, "embark_registry_workloadgroup_out_of_date_writes_total", ""); got != writes+1 {
		t.Errorf("drift writes = %v, want %v (only the new registration's)", got, writes+1)
	}
}
