package lifecycle

import (
	"context"
	"testing"
	"time"

	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/fixtures"
)

// setRegistrationStatus changes a registration's status.
func setRegistrationStatus(t *testing.T, war *runtimev1alpha1.WorkloadAutoRegistration, mutate func(*runtimev1alpha1.WorkloadAutoRegistration)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(war), cur); err != nil {
			return err
		}
		mutate(cur)
		return env.Client.Status().Update(t.Context(), cur)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// waitEntry waits until the WorkloadEntry of war satisfies ok and returns it.
func waitEntry(t *testing.T, war *runtimev1alpha1.WorkloadAutoRegistration, what string, ok func(*istionetworkingv1.WorkloadEntry) bool) *istionetworkingv1.WorkloadEntry {
	t.Helper()
	we := &istionetworkingv1.WorkloadEntry{}
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(war), we); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return ok(we), nil
	})
	if err != nil {
		t.Fatalf("WorkloadEntry %s never %s: %v; last %+v", war.Name, what, err, we.ObjectMeta)
	}
	return we
}

func TestDeletedWorkloadEntryIsRecreated(t *testing.T) {
	ns := env.Namespace(t)
	wg := lifecycleGroup(t, ns)
	wg.Spec.Probe = &istioapi.ReadinessProbe{PeriodSeconds: 5}
	if err := env.Client.Update(t.Context(), wg); err != nil {
		t.Fatal(err)
	}
	fenced, fencedEntry := createRegistration(t, wg, 1)
	live, liveEntry := createRegistration(t, wg, 2)
	connectedAt := time.Now().Add(-time.Minute).Truncate(time.Second)
	setConnection(t, fenced, "replica-a", true, connectedAt)
	setConnection(t, live, "replica-a", true, connectedAt)
	setRegistrationStatus(t, live, func(w *runtimev1alpha1.WorkloadAutoRegistration) {
		meta.SetStatusCondition(&w.Status.Conditions, metav1.Condition{
			Type: registry.ConditionHealthy, Status: metav1.ConditionTrue, Reason: runtimev1alpha1.ReasonProbeSucceeded,
			Message: "the readiness probe passes", LastTransitionTime: metav1.NewTime(connectedAt),
		})
	})
	setRegistrationStatus(t, fenced, func(w *runtimev1alpha1.WorkloadAutoRegistration) {
		meta.SetStatusCondition(&w.Status.Conditions, metav1.Condition{
			Type: runtimev1alpha1.ConditionFenced, Status: metav1.ConditionTrue, Reason: "AddressReused",
			Message: "address reused", LastTransitionTime: metav1.Now(),
		})
	})
	// One worker: the fenced registration, deleted first, is looked at first.
	h := startLifecycle(t, ns, "replica-a", func(o *Options) { o.GracePeriod = time.Hour; o.Workers = 1 })
	for _, we := range []*istionetworkingv1.WorkloadEntry{fencedEntry, liveEntry} {
		if err := env.Client.Delete(t.Context(), we); err != nil {
			t.Fatal(err)
		}
	}

	we := waitEntry(t, live, "re-created", func(we *istionetworkingv1.WorkloadEntry) bool {
		return we.UID != liveEntry.UID && registry.IstioCondition(we.Status.Conditions, registry.ConditionHealthy) != nil
	})
	wantAnn := map[string]string{
		registry.AnnotationWorkloadGroup:       "ratings",
		registry.AnnotationConnectedReplica:    "replica-a",
		registry.AnnotationConnectedAt:         connectedAt.UTC().Format(time.RFC3339Nano),
		registry.AnnotationHealthChecksEnabled: "true",
	}
	for k, v := range wantAnn {
		if we.Annotations[k] != v {
			t.Errorf("re-created entry: annotation %s = %q, want %q", k, we.Annotations[k], v)
		}
	}
	if registry.HasIstiodAnnotations(we.Annotations) {
		t.Errorf("re-created entry carries istiod's annotations: %v", we.Annotations)
	}
	if ref, ok := registry.OwnedBy(we.OwnerReferences, live.Name); !ok || ref.UID != live.UID {
		t.Errorf("re-created entry not owned by its registration: %+v", we.OwnerReferences)
	}
	if c := registry.IstioCondition(we.Status.Conditions, registry.ConditionHealthy); c.GetStatus() != "True" {
		t.Errorf("re-created entry: Healthy = %+v, want True from the registration", c)
	}
	if we.Spec.Address != liveEntry.Spec.Address {
		t.Errorf("re-created entry: address %s, want %s", we.Spec.Address, liveEntry.Spec.Address)
	}
	fixtures.WaitEvent(t, env.Client, ns, live.Name, ReasonWorkloadEntryRecreated, "deleted while its registration lives")
	if got := metricValue(t, h.reg, "embark_registry_workloadentry_recreations_total", ""); got != 1 {
		t.Errorf("recreations = %v, want 1 (the fenced registration's entry stays gone)", got)
	}
	err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(fencedEntry), &istionetworkingv1.WorkloadEntry{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("the fenced registration's entry: %v, want it not re-created", err)
	}
}

func TestIstiodAnnotationsAreRemoved(t *testing.T) {
	ns := env.Namespace(t)
	wg := lifecycleGroup(t, ns)
	war, we := createRegistration(t, wg, 1)
	setConnection(t, war, "replica-a", true, time.Now())
	// As an earlier Embark version wrote it.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &istionetworkingv1.WorkloadEntry{}
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(we), cur); err != nil {
			return err
		}
		for _, k := range registry.IstiodAnnotations {
			cur.Annotations[k] = "2026-11-24T00:00:00Z"
		}
		cur.Annotations["example.com/kept"] = "yes"
		return env.Client.Update(t.Context(), cur)
	})
	if err != nil {
		t.Fatal(err)
	}
	startLifecycle(t, ns, "replica-a", func(o *Options) { o.GracePeriod = time.Hour })
	got := waitEntry(t, war, "lost istiod's annotations", func(we *istionetworkingv1.WorkloadEntry) bool {
		return !registry.HasIstiodAnnotations(we.Annotations)
	})
	if got.UID != we.UID || got.Annotations["example.com/kept"] != "yes" || got.Annotations[registry.AnnotationWorkloadGroup] != "ratings" {
		t.Errorf("migrated entry: uid %s (was %s), annotations %v", got.UID, we.UID, got.Annotations)
	}
}
