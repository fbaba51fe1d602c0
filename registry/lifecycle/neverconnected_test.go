package lifecycle

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/fixtures"
)

func TestNeverConnectedDue(t *testing.T) {
	now := time.Date(2021, 10, 9, 10, 0, 0, 0, time.UTC)
	after := time.Minute
	ts := func(ago time.Duration) *metav1.Time { return ptr.To(metav1.NewTime(now.Add(-ago))) }
	cond := func(status metav1.ConditionStatus, reason string) []metav1.Condition {
		return []metav1.Condition{{Type: runtimev1alpha1.ConditionAgentConnected, Status: status, Reason: reason, LastTransitionTime: *ts(time.Second)}}
	}
	tests := []struct {
		name    string
		created time.Duration // ago
		status  runtimev1alpha1.WorkloadAutoRegistrationStatus
		deleted bool
		wantDue bool
		wantAt  time.Time
	}{
		{name: "young, no condition", created: 30 * time.Second, wantAt: now.Add(31 * time.Second)},
		{name: "the time ago, to the second: not yet", created: after, wantAt: now.Add(time.Second)},
		{name: "old, no condition", created: 2 * time.Minute, wantDue: true, wantAt: now.Add(-59 * time.Second)},
		{name: "old, Unknown", created: 2 * time.Minute, status: runtimev1alpha1.WorkloadAutoRegistrationStatus{Conditions: cond(metav1.ConditionUnknown, "Starting")}, wantDue: true, wantAt: now.Add(-59 * time.Second)},
		{name: "already written", created: 2 * time.Minute, status: runtimev1alpha1.WorkloadAutoRegistrationStatus{Conditions: cond(metav1.ConditionFalse, runtimev1alpha1.ReasonAgentNeverConnected)}},
		{name: "connected", created: 2 * time.Minute, status: runtimev1alpha1.WorkloadAutoRegistrationStatus{Conditions: cond(metav1.ConditionTrue, runtimev1alpha1.ReasonAgentEstablishedConnection), Connection: &runtimev1alpha1.ConnectionStatus{Replica: "a", ConnectedAt: ts(time.Second)}}},
		{name: "disconnected", created: 2 * time.Minute, status: runtimev1alpha1.WorkloadAutoRegistrationStatus{Conditions: cond(metav1.ConditionFalse, runtimev1alpha1.ReasonAgentDisconnected), Connection: &runtimev1alpha1.ConnectionStatus{Replica: "a", ConnectedAt: ts(time.Minute), DisconnectedAt: ts(time.Second)}}},
		{name: "a connection recorded without a condition", created: 2 * time.Minute, status: runtimev1alpha1.WorkloadAutoRegistrationStatus{Connection: &runtimev1alpha1.ConnectionStatus{Replica: "a", ConnectedAt: ts(time.Second)}}},
		{name: "being deleted", created: 2 * time.Minute, deleted: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			war := &runtimev1alpha1.WorkloadAutoRegistration{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: *ts(tt.created)}, Status: tt.status}
			if tt.deleted {
				war.DeletionTimestamp = ts(0)
			}
			due, at := neverConnectedDue(war, now, after)
			if due != tt.wantDue || !at.Equal(tt.wantAt) {
				t.Errorf("neverConnectedDue = %v, %s; want %v, %s", due, at, tt.wantDue, tt.wantAt)
			}
		})
	}
}

// A registration whose sidecar never connects shows AgentNeverConnected
// (written once, with an Event) after NeverConnectedAfter, and is still
// removed at the end of the grace period counted from its creation; one
// that connects in time never shows it.
func TestSweeperWritesAgentNeverConnectedThenRemoves(t *testing.T) {
	ns := env.Namespace(t)
	wg := lifecycleGroup(t, ns)
	h := startLifecycle(t, ns, "replica-a", func(o *Options) {
		o.NeverConnectedAfter = time.Second
		o.GracePeriod = 6 * time.Second
	})
	silent, _ := createRegistration(t, wg, 1)
	quick, _ := createRegistration(t, wg, 2)
	// The connection is established after the replica started: one stamped
	// before its start would rightly count as one of a previous run.
	select {
	case <-h.lc.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("replica-a never became ready")
	}
	setConnection(t, quick, "replica-a", true, time.Now())

	var cond *metav1.Condition
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 15*time.Second, true, func(context.Context) (bool, error) {
		cond = meta.FindStatusCondition(getRegistration(t, silent).Status.Conditions, runtimev1alpha1.ConditionAgentConnected)
		return cond != nil && cond.Reason == runtimev1alpha1.ReasonAgentNeverConnected, nil
	})
	if err != nil {
		t.Fatalf("no AgentNeverConnected on %s: %v (condition %+v)", silent.Name, err, cond)
	}
	if cond.Status != metav1.ConditionFalse || !strings.Contains(cond.Message, "has not opened an ADS stream") {
		t.Errorf("condition = %+v, want False with a message saying no stream was opened", cond)
	}
	if cond.LastTransitionTime.Time.Before(silent.CreationTimestamp.Add(time.Second)) {
		t.Errorf("written at %s, before NeverConnectedAfter passed since creation %s", cond.LastTransitionTime, silent.CreationTimestamp)
	}
	fixtures.WaitEvent(t, env.Client, ns, silent.Name, runtimev1alpha1.ReasonAgentNeverConnected, "has not opened an ADS stream")

	// Removed on time, from the creation, not from the condition.
	waitRemovedOnTime(t, silent, silent.CreationTimestamp.Add(7*time.Second), onTime)
	if got := meta.FindStatusCondition(getRegistration(t, quick).Status.Conditions, runtimev1alpha1.ConditionAgentConnected); got == nil || got.Status != metav1.ConditionTrue {
		t.Errorf("connected registration: AgentConnected = %+v, want True", got)
	}
}
