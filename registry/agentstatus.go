package registry

import (
	"context"
	"reflect"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
