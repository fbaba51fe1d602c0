package registry

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// Unregister deletes the registration key on behalf of the agent session
// holding it: id must be the registration's workload and sessionKey the
// session key it is bound to (CheckHolder). The delete names the UID read,
// so a registration created again under the name since is left alone, and
// it goes through the replica's write budget like every other write of the
// registry; the WorkloadEntry and the sidecar credential Secret follow by
// owner references. It reports whether a registration was deleted: a
// registration already gone is not an error.
func (r *Registrar) Unregister(ctx context.Context, key types.NamespacedName, id runtimev1alpha1.WorkloadIdentity, sessionKey string) (bool, error) {
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := r.client.Get(ctx, key, war); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("read registration %s: %w", key, err)
	}
	if err := CheckHolder(war, id, sessionKey); err != nil {
		return false, err
	}
	err := r.writer.Do(ctx, func(ctx context.Context) error {
		return r.client.Delete(ctx, war, client.Preconditions{UID: &war.UID})
	})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("delete registration %s: %w", key, err)
	}
	r.log.Info("unregistered workload", "registration", key.String())
	return true, nil
}
