package lifecycle

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry/replica"
)

func TestReplicaLeaseRenewedAndReleased(t *testing.T) {
	ns := env.Namespace(t)
	wg := lifecycleGroup(t, ns)
	// a watches; b is the replica that comes and goes. No resync: the
	// release is noticed through the Lease's deletion.
	a := startLifecycle(t, ns, "replica-a", func(o *Options) { o.GracePeriod = time.Hour; o.ResyncPeriod = time.Hour })
	b := startLifecycle(t, ns, "replica-b", func(o *Options) { o.GracePeriod = time.Hour; o.ResyncPeriod = time.Hour })

	select {
	case <-b.lc.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("Lifecycle never ready")
	}
	key := client.ObjectKey{Namespace: ns, Name: replica.LeaseName("replica-b")}
	if err := env.Client.Get(t.Context(), key, &coordinationv1.Lease{}); err != nil {
		t.Fatalf("replica Lease once ready: %v", err)
	}
	var first *coordinationv1.Lease
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		lease := &coordinationv1.Lease{}
		if err := env.Client.Get(ctx, key, lease); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if first == nil {
			first = lease
			return false, nil
		}
		// Renewed: a later renewTime, same incarnation.
		return lease.Spec.RenewTime.After(first.Spec.RenewTime.Time) && lease.Spec.AcquireTime.Equal(first.Spec.AcquireTime), nil
	})
	if err != nil {
		t.Fatalf("replica Lease not renewed: %v", err)
	}
	if ptr.Deref(first.Spec.HolderIdentity, "") != "replica-b" || first.Labels[replica.LabelLease] != "true" || ptr.Deref(first.Spec.LeaseDurationSeconds, 0) != 2 {
		t.Errorf("Lease = %+v %+v", first.Labels, first.Spec)
	}
	err = wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return a.lc.Replicas().IsAlive("replica-b"), nil
	})
	if err != nil {
		t.Fatal("replica-a never saw replica-b alive")
	}
	if a.lc.Replicas().IsAlive("replica-c") {
		t.Error("a replica without a Lease is alive")
	}

	// A workload connected to b; b shuts down cleanly and deletes its
	// Lease; the connection is marked gone at once.
	war, _ := createRegistration(t, wg, 1)
	setConnection(t, war, "replica-b", true, time.Now())
	b.stop(t)
	if err := env.Client.Get(t.Context(), key, &coordinationv1.Lease{}); !apierrors.IsNotFound(err) {
		t.Errorf("replica Lease after a clean shutdown: %v, want NotFound", err)
	}
	cur := waitCondition(t, war, runtimev1alpha1.ConditionAgentConnected, metav1.ConditionFalse, ReasonReplicaGone)
	if msg := meta.FindStatusCondition(cur.Status.Conditions, runtimev1alpha1.ConditionAgentConnected).Message; !strings.Contains(msg, "replica-b") {
		t.Errorf("message %q does not name the replica", msg)
	}
	if a.lc.Replicas().IsAlive("replica-b") {
		t.Error("replica-b still alive after its shutdown")
	}
}
