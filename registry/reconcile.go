package registry

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry/write"
)

// UpdateRegistrationStatus writes a registration's status when mutate changes
// it, with optimistic concurrency. The first attempt starts from a deep copy
// of the cached object; after a conflict it starts from a fresh read. mutate
// returns false when nothing needs writing. It is the one "write status only
// when it changed" helper of the registry's reconcilers (enforcement, drift,
// never-connected, sweeper).
func UpdateRegistrationStatus(ctx context.Context, w *write.Writer, c client.Client, reader client.Reader, cached *runtimev1alpha1.WorkloadAutoRegistration, mutate func(*runtimev1alpha1.WorkloadAutoRegistration) bool) (bool, error) {
	key := client.ObjectKeyFromObject(cached)
	first, written := true, false
	err := w.Do(ctx, func(ctx context.Context) error {
		cur := &runtimev1alpha1.WorkloadAutoRegistration{}
		if first {
			cached.DeepCopyInto(cur)
			first = false
		} else if err := reader.Get(ctx, key, cur); err != nil {
			return err
		}
		if cur.DeletionTimestamp != nil || !mutate(cur) {
			return nil
		}
		if err := c.Status().Update(ctx, cur); err != nil {
			return err
		}
		written = true
		return nil
	})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return written, err
}
