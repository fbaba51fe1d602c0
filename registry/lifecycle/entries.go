package lifecycle

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/protobuf/types/known/timestamppb"
	istiometa "istio.io/api/meta/v1alpha1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/write"
)

// Reasons of the Events the entry reconciler records on registrations.
const (
	// ReasonWorkloadEntryRecreated (Warning): the registration's
	// WorkloadEntry was deleted by someone else while the registration
	// lived, and was created again.
	ReasonWorkloadEntryRecreated = "WorkloadEntryRecreated"
	// ReasonWorkloadEntryNotRecreated (Warning): the WorkloadEntry is gone
	// and another WorkloadEntry now holds its address, so it is not
	// created again.
	ReasonWorkloadEntryNotRecreated = "WorkloadEntryNotRecreated"
)

// DefaultRecreateQPS is Options.RecreateQPS's default.
const DefaultRecreateQPS = 10.0

// entryReconciler keeps every live registration's WorkloadEntry: one deleted
// by anyone (an operator, istiod's clean-up, a script) while its
// registration lives is created again from the registration, with the
// registration's connection state and Healthy condition; an entry carrying
// istiod's auto-registration annotations (written by an earlier version) is
// rewritten without them. Level-based from the informer caches of
// registrations and WorkloadEntries; only the sweeper leader runs it, and
// re-creations are rate-limited.
type entryReconciler struct {
	client   client.Client
	reader   client.Reader
	cache    cache.Cache
	writer   *write.Writer
	recorder record.EventRecorder
	limit    *rate.Limiter
	log      *slog.Logger
	metrics  *Metrics
	resync   time.Duration
	workers  int
	now      func() time.Time
}

// run reconciles until ctx ends.
func (e *entryReconciler) run(ctx context.Context) error {
	l := newLoop(e.cache, "keep WorkloadEntry", e.reconcile, e.workers, e.resync, e.log)
	defer l.ShutDown()
	if err := watchRegistrations(ctx, l, e.cache); err != nil {
		return err
	}
	// A WorkloadEntry's registration has the entry's name and namespace.
	enqueueEntry := func(obj any) {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if we, ok := obj.(*istionetworkingv1.WorkloadEntry); ok {
			if _, managed := registry.OwnedBy(we.OwnerReferences, we.Name); managed {
				l.Add(client.ObjectKeyFromObject(we))
			}
		}
	}
	err := l.Watch(ctx, e.cache, &istionetworkingv1.WorkloadEntry{}, toolscache.ResourceEventHandlerFuncs{
		AddFunc:    enqueueEntry,
		UpdateFunc: func(_, obj any) { enqueueEntry(obj) },
		DeleteFunc: enqueueEntry,
	})
	if err != nil {
		return err
	}
	l.Run(ctx)
	return nil
}

// reconcile keeps the WorkloadEntry of one registration.
func (e *entryReconciler) reconcile(ctx context.Context, key types.NamespacedName) error {
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := e.cache.Get(ctx, key, war); err != nil {
		return client.IgnoreNotFound(err)
	}
	if war.DeletionTimestamp != nil || meta.IsStatusConditionTrue(war.Status.Conditions, runtimev1alpha1.ConditionFenced) {
		// Being removed, or fenced: its address went to a newer
		// registration, whose entry it must not shadow.
		return nil
	}
	we := &istionetworkingv1.WorkloadEntry{}
	err := e.cache.Get(ctx, key, we)
	switch {
	case err == nil:
		return e.migrate(ctx, war, we)
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("read WorkloadEntry %s: %w", key, err)
	}
	// Missing from the cache: make sure it is missing, and that the
	// registration still lives, before creating it again.
	if err := e.reader.Get(ctx, key, we); err == nil || !apierrors.IsNotFound(err) {
		return client.IgnoreNotFound(err)
	}
	live := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := e.reader.Get(ctx, key, live); err != nil {
		return client.IgnoreNotFound(err)
	}
	if live.UID != war.UID || live.DeletionTimestamp != nil || !e.registeredOnce(live) ||
		meta.IsStatusConditionTrue(live.Status.Conditions, runtimev1alpha1.ConditionFenced) {
		return nil
	}
	return e.recreate(ctx, live)
}

// registeredOnce reports whether the registration is old enough that
// Register has written its entry (a registration created a moment ago is
// still being written by Register, which fences addresses first).
func (e *entryReconciler) registeredOnce(war *runtimev1alpha1.WorkloadAutoRegistration) bool {
	return war.Status.Connection != nil || e.now().Sub(war.CreationTimestamp.Time) > registerWindow
}

// registerWindow is how long after its creation a registration without a
// connection is left to Register.
const registerWindow = 10 * time.Second

// recreate creates the registration's WorkloadEntry again, with its
// connection state and Healthy condition.
func (e *entryReconciler) recreate(ctx context.Context, war *runtimev1alpha1.WorkloadAutoRegistration) error {
	key := client.ObjectKeyFromObject(war)
	want, err := registry.BuildWorkloadEntry(war)
	if err != nil {
		return nil //nolint:nilerr // an undecodable snapshot was refused at registration; nothing to retry
	}
	holder, err := e.addressHolder(ctx, want)
	if err != nil {
		return err
	}
	if holder != "" {
		e.recorder.Eventf(war, corev1.EventTypeWarning, ReasonWorkloadEntryNotRecreated,
			"WorkloadEntry %s was deleted and is not created again: WorkloadEntry %s now holds address %s on network %q", key.Name, holder, want.Spec.Address, want.Spec.Network)
		return nil
	}
	if conn := war.Status.Connection; conn != nil {
		if conn.ConnectedAt != nil {
			want.Annotations[registry.AnnotationConnectedAt] = conn.ConnectedAt.UTC().Format(time.RFC3339Nano)
		}
		if conn.Replica != "" {
			want.Annotations[registry.AnnotationConnectedReplica] = conn.Replica
		}
	}
	if err := e.limit.Wait(ctx); err != nil {
		return fmt.Errorf("re-create WorkloadEntry %s: %w", key, err)
	}
	created := want.DeepCopy()
	err = e.writer.Do(ctx, func(ctx context.Context) error { return e.client.Create(ctx, created) })
	if apierrors.IsAlreadyExists(err) {
		return nil // written meanwhile (Register, another round)
	}
	if err != nil {
		return fmt.Errorf("re-create WorkloadEntry %s: %w", key, err)
	}
	e.log.Warn("re-created a WorkloadEntry deleted while its registration lives", "registration", key.String())
	e.recorder.Eventf(war, corev1.EventTypeWarning, ReasonWorkloadEntryRecreated,
		"WorkloadEntry %s was deleted while its registration lives; created again", key.Name)
	e.metrics.recreated()
	if cond := healthFromRegistration(war); cond != nil && want.Annotations[registry.AnnotationHealthChecksEnabled] == "true" {
		err := e.writer.Do(ctx, func(ctx context.Context) error {
			cur := &istionetworkingv1.WorkloadEntry{}
			if err := e.client.Get(ctx, key, cur); err != nil {
				return err
			}
			if cur.UID != created.UID || registry.IstioCondition(cur.Status.Conditions, registry.ConditionHealthy) != nil {
				return nil // a newer report was stored meanwhile
			}
			cur.Status.Conditions = registry.SetIstioCondition(cur.Status.Conditions, cond)
			return e.client.Status().Update(ctx, cur)
		})
		if err != nil {
			return fmt.Errorf("restore Healthy condition of re-created WorkloadEntry %s: %w", key, client.IgnoreNotFound(err))
		}
	}
	return nil
}

// healthFromRegistration is the WorkloadEntry Healthy condition the
// registration's mirror of it says, or nil.
func healthFromRegistration(war *runtimev1alpha1.WorkloadAutoRegistration) *istiometa.IstioCondition {
	c := meta.FindStatusCondition(war.Status.Conditions, registry.ConditionHealthy)
	if c == nil {
		return nil
	}
	at := timestamppb.New(c.LastTransitionTime.Time)
	out := &istiometa.IstioCondition{
		Type: registry.ConditionHealthy, Status: string(c.Status), Reason: c.Reason,
		LastProbeTime: at, LastTransitionTime: at,
	}
	if c.Status != metav1.ConditionTrue {
		out.Message = "restored from the registration: " + c.Message
	}
	return out
}

// addressHolder returns the namespace/name of another WorkloadEntry holding
// want's address on want's network, if any.
func (e *entryReconciler) addressHolder(ctx context.Context, want *istionetworkingv1.WorkloadEntry) (string, error) {
	list := &istionetworkingv1.WorkloadEntryList{}
	if err := e.cache.List(ctx, list, client.MatchingFields{registry.AddressIndex: registry.AddressKey(want.Spec.Network, want.Spec.Address)}); err != nil {
		// No address index on this cache: look at every entry.
		list = &istionetworkingv1.WorkloadEntryList{}
		if err := e.cache.List(ctx, list); err != nil {
			return "", fmt.Errorf("find WorkloadEntries holding %s: %w", want.Spec.Address, err)
		}
	}
	for _, we := range list.Items {
		if we.Spec.Address != want.Spec.Address || we.Spec.Network != want.Spec.Network ||
			(we.Namespace == want.Namespace && we.Name == want.Name) {
			continue
		}
		return we.Namespace + "/" + we.Name, nil
	}
	return "", nil
}

// migrate removes istiod's auto-registration annotations from the
// registration's entry.
func (e *entryReconciler) migrate(ctx context.Context, war *runtimev1alpha1.WorkloadAutoRegistration, cached *istionetworkingv1.WorkloadEntry) error {
	if ref, ok := registry.OwnedBy(cached.OwnerReferences, war.Name); !ok || ref.UID != war.UID || !registry.HasIstiodAnnotations(cached.Annotations) {
		return nil
	}
	key := client.ObjectKeyFromObject(cached)
	err := e.writer.Do(ctx, func(ctx context.Context) error {
		cur := &istionetworkingv1.WorkloadEntry{}
		if err := e.client.Get(ctx, key, cur); err != nil {
			return err
		}
		if cur.UID != cached.UID || !registry.HasIstiodAnnotations(cur.Annotations) {
			return nil
		}
		cur.Annotations = registry.WithoutIstiodAnnotations(cur.Annotations)
		return e.client.Update(ctx, cur)
	})
	if err != nil {
		return fmt.Errorf("remove istiod's annotations from WorkloadEntry %s: %w", key, client.IgnoreNotFound(err))
	}
	e.log.Info("removed istiod's auto-registration annotations from a WorkloadEntry", "registration", key.String())
	return nil
}
