package lifecycle

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
)

// DefaultNeverConnectedAfter is how long after registering a workload whose
// sidecar has not opened an ADS stream is shown AgentConnected=False, reason
// AgentNeverConnected.
const DefaultNeverConnectedAfter = time.Minute

// neverConnectedDue reports whether war should now be shown
// AgentConnected=False/AgentNeverConnected: it has no AgentConnected
// condition (or an Unknown one), no connection was ever recorded, and it was
// created at least after ago. When it is not due yet, at is when it will be
// (zero when it never will: connected, disconnected, or already written).
func neverConnectedDue(war *runtimev1alpha1.WorkloadAutoRegistration, now time.Time, after time.Duration) (due bool, at time.Time) {
	if war.DeletionTimestamp != nil {
		return false, time.Time{}
	}
	if c := war.Status.Connection; c != nil && (c.ConnectedAt != nil || c.DisconnectedAt != nil) {
		return false, time.Time{}
	}
	if cond := meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected); cond != nil && cond.Status != metav1.ConditionUnknown {
		return false, time.Time{}
	}
	// The stored creation second may hide up to a second: never early.
	at = war.CreationTimestamp.Truncate(time.Second).Add(time.Second + after)
	return !now.Before(at), at
}

// markNeverConnected writes AgentConnected=False, reason AgentNeverConnected
// (with an Event of that reason) when it is due and not written yet. A
// connection written in between wins: the write is conditional on the
// resourceVersion and the check is made again on the live object.
func (s *sweeper) markNeverConnected(ctx context.Context, cached *runtimev1alpha1.WorkloadAutoRegistration) error {
	var msg string
	written, err := registry.UpdateRegistrationStatus(ctx, s.writer, s.client, s.reader, cached, func(cur *runtimev1alpha1.WorkloadAutoRegistration) bool {
		now := s.now()
		if due, _ := neverConnectedDue(cur, now, s.neverConnectedAfter); !due {
			return false
		}
		msg = fmt.Sprintf("registered at %s; its sidecar has not opened an ADS stream to any endpoint replica within %s; "+
			"it is removed unless it connects by %s (grace period %s)",
			cur.CreationTimestamp.UTC().Format(time.RFC3339), s.neverConnectedAfter,
			cur.CreationTimestamp.Truncate(time.Second).Add(time.Second+s.grace).UTC().Format(time.RFC3339), s.grace)
		meta.SetStatusCondition(&cur.Status.Conditions, metav1.Condition{
			Type: runtimev1alpha1.ConditionAgentConnected, Status: metav1.ConditionFalse,
			Reason: runtimev1alpha1.ReasonAgentNeverConnected, Message: msg,
			ObservedGeneration: cur.Generation, LastTransitionTime: metav1.NewTime(now),
		})
		return true
	})
	if err != nil {
		return fmt.Errorf("mark %s/%s never connected: %w", cached.Namespace, cached.Name, err)
	}
	if written {
		s.log.Info("registration never connected", "registration", cached.Namespace+"/"+cached.Name, "after", s.neverConnectedAfter)
		s.recorder.Event(cached, corev1.EventTypeWarning, runtimev1alpha1.ReasonAgentNeverConnected, msg)
	}
	return nil
}
