package registry

import (
	"context"
	"reflect"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// recordAgent writes what the agent reported about itself (its version and
// its last failed onboarding attempt) to the registration's status.agent,
// through the write budget, only when it differs from what is stored; the
// report time is that of the change. The report is for operators and
// decides nothing, so failing to write it is logged, not returned: the
// registration itself is complete. war is updated with what was written.
func (r *Registrar) recordAgent(ctx context.Context, war *runtimev1alpha1.WorkloadAutoRegistration, version string, lastError *runtimev1alpha1.AgentError) {
	if agentReportEqual(war.Status.Agent, version, lastError) {
		return
	}
	key := client.ObjectKeyFromObject(war)
	cur := &runtimev1alpha1.WorkloadAutoRegistration{}
	err := r.writer.Do(ctx, func(ctx context.Context) error {
		if err := r.client.Get(ctx, key, cur); err != nil {
			return err
		}
		if cur.UID != war.UID || agentReportEqual(cur.Status.Agent, version, lastError) {
			return nil
		}
		now := metav1.NewTime(r.now())
		cur.Status.Agent = &runtimev1alpha1.AgentStatus{Version: version, LastError: lastError.DeepCopy(), ReportedAt: &now}
		return r.client.Status().Update(ctx, cur)
	})
	switch {
	case err == nil && cur.UID == war.UID:
		war.Status.Agent = cur.Status.Agent
		war.ResourceVersion = cur.ResourceVersion
	case err != nil && !apierrors.IsNotFound(err):
		r.log.Error("write the agent's report to status.agent", "registration", key.String(), "error", err)
	}
}

// agentReportEqual reports whether stored holds version and lastError.
func agentReportEqual(stored *runtimev1alpha1.AgentStatus, version string, lastError *runtimev1alpha1.AgentError) bool {
	if stored == nil {
		return version == "" && lastError == nil
	}
	return stored.Version == version && reflect.DeepEqual(stored.LastError, lastError)
}

// writeNewStatus writes, in the background, the status of war, a
// registration just created: its NetworkTopology condition (as
// checkTopology decides it) and the agent's report (as recordAgent does),
// in one status update of war as created, with no read. The channel
// yields war as stored once the write has ended, or nil when nothing was
// written. When the registration changed since it was created (a
// conflict), the status is written as for an existing registration
// (checkTopology, recordAgent). A failure is logged: the status says
// what the workload reported and decides nothing.
func (r *Registrar) writeNewStatus(ctx context.Context, war *runtimev1alpha1.WorkloadAutoRegistration, version string, lastError *runtimev1alpha1.AgentError) <-chan *runtimev1alpha1.WorkloadAutoRegistration {
	out := make(chan *runtimev1alpha1.WorkloadAutoRegistration, 1)
	go func() {
		out <- r.newStatus(ctx, war, version, lastError)
	}()
	return out
}

// newStatus is writeNewStatus's write.
func (r *Registrar) newStatus(ctx context.Context, war *runtimev1alpha1.WorkloadAutoRegistration, version string, lastError *runtimev1alpha1.AgentError) *runtimev1alpha1.WorkloadAutoRegistration {
	key := client.ObjectKeyFromObject(war)
	address := ""
	if want, err := BuildWorkloadEntry(war); err == nil {
		address = want.Spec.Address
	}
	cond, writeCond, err := r.topologyConditionOf(war, address)
	if err != nil {
		r.log.Error("read the registration's WorkloadGroup snapshot", "registration", key.String(), "error", err)
	}
	if writeCond {
		cond.ObservedGeneration, cond.LastTransitionTime = war.Generation, metav1.NewTime(r.now())
		meta.SetStatusCondition(&war.Status.Conditions, cond)
	}
	report := !agentReportEqual(war.Status.Agent, version, lastError)
	if report {
		now := metav1.NewTime(r.now())
		war.Status.Agent = &runtimev1alpha1.AgentStatus{Version: version, LastError: lastError.DeepCopy(), ReportedAt: &now}
	}
	if !writeCond && !report {
		return nil
	}
	conflict := false
	err = r.writer.Do(ctx, func(ctx context.Context) error {
		err := r.client.Status().Update(ctx, war)
		if apierrors.IsConflict(err) {
			conflict = true
			return nil
		}
		return err
	})
	switch {
	case conflict:
		cur := war.DeepCopy()
		cur.Status = runtimev1alpha1.WorkloadAutoRegistrationStatus{}
		r.checkTopology(ctx, cur, address)
		r.recordAgent(ctx, cur, version, lastError)
		return nil
	case err != nil:
		if !apierrors.IsNotFound(err) {
			r.log.Error("write the new registration's status", "registration", key.String(), "error", err)
		}
		return nil
	}
	if writeCond && cond.Status == metav1.ConditionFalse {
		r.recorder.Event(war, corev1.EventTypeWarning, cond.Reason, cond.Message)
	}
	return war
}
