package lifecycle

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/time/rate"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/write"
)

// Kind label values of embark_registry_orphans_removed_total.
const (
	orphanSecret        = "secret"
	orphanWorkloadEntry = "workloadentry"
)

// orphanMinAge is how old an object must be before it may be judged
// orphaned. Register creates the registration before the objects it owns,
// each with an owner reference carrying the registration's UID, and the
// judgement reads the registration from the API server, so a live
// registration's objects are never taken for orphans; the wait only keeps
// the collector away from objects a Register call is still writing.
const orphanMinAge = registerWindow

// dependentKind is one kind of object Embark writes for a registration and
// the orphan collector looks after.
type dependentKind struct {
	// name labels the metric and logs.
	name string
	// newObject returns an empty object of the kind.
	newObject func() client.Object
	// newList returns an empty list of the kind.
	newList func() client.ObjectList
	// items returns the objects of a list made by newList.
	items func(client.ObjectList) []client.Object
	// ours reports whether Embark wrote the object for a registration.
	ours func(client.Object) bool
}

// sidecarCredentials are the Secrets sidecar tokens are bound to
// (registry.LabelSidecarCredential, type registry.SecretTypeSidecarCredential).
// While one exists, every token bound to it passes a TokenReview, so
// istiod's CA keeps signing certificates for it.
var sidecarCredentials = dependentKind{
	name:      orphanSecret,
	newObject: func() client.Object { return &corev1.Secret{} },
	newList:   func() client.ObjectList { return &corev1.SecretList{} },
	items: func(l client.ObjectList) []client.Object {
		list := l.(*corev1.SecretList)
		out := make([]client.Object, len(list.Items))
		for i := range list.Items {
			out[i] = &list.Items[i]
		}
		return out
	},
	ours: func(o client.Object) bool {
		s, ok := o.(*corev1.Secret)
		return ok && s.Type == registry.SecretTypeSidecarCredential && s.Labels[registry.LabelSidecarCredential] == "true"
	},
}

// workloadEntries are the registrations' WorkloadEntries (annotation
// registry.AnnotationWorkloadGroup). One left behind keeps a VM that is no
// longer registered an endpoint of its Services.
var workloadEntries = dependentKind{
	name:      orphanWorkloadEntry,
	newObject: func() client.Object { return &istionetworkingv1.WorkloadEntry{} },
	newList:   func() client.ObjectList { return &istionetworkingv1.WorkloadEntryList{} },
	items: func(l client.ObjectList) []client.Object {
		list := l.(*istionetworkingv1.WorkloadEntryList)
		out := make([]client.Object, len(list.Items))
		for i := range list.Items {
			out[i] = list.Items[i]
		}
		return out
	},
	ours: func(o client.Object) bool {
		we, ok := o.(*istionetworkingv1.WorkloadEntry)
		return ok && we.Annotations[registry.AnnotationWorkloadGroup] != ""
	},
}

// orphanVerdict is what the collector does with an object of Embark's.
type orphanVerdict int

const (
	// orphanKeep: the object belongs to a live registration (or is being
	// deleted already).
	orphanKeep orphanVerdict = iota
	// orphanWait: too young to judge; look again at orphanDecision.at.
	orphanWait
	// orphanRemove: its registration is gone.
	orphanRemove
)

// orphanDecision is the collector's verdict on one object.
type orphanDecision struct {
	verdict orphanVerdict
	at      time.Time
	why     string
}

// registrationLookup returns the registration of that name in the object's
// namespace, or nil when there is none.
type registrationLookup func(ctx context.Context, name string) (*runtimev1alpha1.WorkloadAutoRegistration, error)

// judgeOrphan decides whether obj, an object Embark wrote for a
// registration, has lost it. It has when it names no registration as its
// controlling owner (the garbage collector removes that reference when the
// registration is deleted with orphan propagation, `kubectl delete
// --cascade=orphan`), or when the registration it names does not exist
// with the UID it names (deleted; one of the same name registered since is
// another one, and neither Embark nor its xDS server accept an object
// owned by another incarnation). An object younger than minAge is not
// judged yet.
func judgeOrphan(ctx context.Context, obj client.Object, now time.Time, minAge time.Duration, lookup registrationLookup) (orphanDecision, error) {
	if obj.GetDeletionTimestamp() != nil {
		return orphanDecision{verdict: orphanKeep}, nil
	}
	if at := obj.GetCreationTimestamp().Add(minAge); now.Before(at) {
		return orphanDecision{verdict: orphanWait, at: at}, nil
	}
	ref, owned := registry.OwnedBy(obj.GetOwnerReferences(), "")
	if !owned {
		return orphanDecision{verdict: orphanRemove, why: "it names no registration as its owner (its registration was deleted with orphan propagation)"}, nil
	}
	war, err := lookup(ctx, ref.Name)
	if err != nil {
		return orphanDecision{}, err
	}
	switch {
	case war == nil:
		return orphanDecision{verdict: orphanRemove, why: fmt.Sprintf("its registration %s (uid %s) no longer exists", ref.Name, ref.UID)}, nil
	case war.UID != ref.UID:
		return orphanDecision{verdict: orphanRemove, why: fmt.Sprintf("its registration %s (uid %s) no longer exists; the registration of that name now is uid %s", ref.Name, ref.UID, war.UID)}, nil
	}
	return orphanDecision{verdict: orphanKeep}, nil
}

// orphanCollector removes the objects of one kind Embark wrote for a
// registration once the registration is gone without them: a registration
// deleted with orphan propagation leaves its credential Secret (whose bound
// tokens keep getting certificates from istiod's CA) and its WorkloadEntry
// (a dead VM as an endpoint) behind, and they block the workload's next
// registration of the same name. Level-based from the informer cache; only
// the sweeper leader runs it; every judgement is confirmed with the API
// server, and removals share the sweeper's rate limit and the replica's
// write budget.
type orphanCollector struct {
	kind     dependentKind
	client   client.Client
	reader   client.Reader
	cache    cache.Cache
	writer   *write.Writer
	removals *rate.Limiter
	metrics  *Metrics
	log      *slog.Logger
	resync   time.Duration
	workers  int
	now      func() time.Time
	minAge   time.Duration

	queue queue
}

// run collects orphans until ctx ends.
func (o *orphanCollector) run(ctx context.Context) error {
	l := newLoopOf("remove orphaned "+o.kind.name, o.reconcile, o.workers, o.resync, o.log, o.keys)
	defer l.ShutDown()
	o.queue = l
	enqueue := func(obj any) {
		if c, ok := obj.(client.Object); ok && o.kind.ours(c) {
			l.Add(client.ObjectKeyFromObject(c))
		}
	}
	err := l.Watch(ctx, o.cache, o.kind.newObject(), toolscache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	})
	if err != nil {
		return err
	}
	l.Run(ctx)
	return nil
}

// keys lists the objects of the kind the cache holds, for a resync.
func (o *orphanCollector) keys(ctx context.Context) ([]types.NamespacedName, error) {
	list := o.kind.newList()
	if err := o.cache.List(ctx, list); err != nil {
		return nil, fmt.Errorf("list %s objects: %w", o.kind.name, err)
	}
	var keys []types.NamespacedName
	for _, obj := range o.kind.items(list) {
		if o.kind.ours(obj) {
			keys = append(keys, client.ObjectKeyFromObject(obj))
		}
	}
	return keys, nil
}

// reconcile judges one object as the cache shows it, and removes it when
// the API server confirms its registration is gone.
func (o *orphanCollector) reconcile(ctx context.Context, key types.NamespacedName) error {
	obj := o.kind.newObject()
	if err := o.cache.Get(ctx, key, obj); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !o.kind.ours(obj) {
		return nil
	}
	// A first, cheap judgement from the cache; remove confirms it with
	// the API server.
	d, err := judgeOrphan(ctx, obj, o.now(), o.minAge, lookupIn(o.cache, key.Namespace))
	if err != nil {
		return err
	}
	switch d.verdict {
	case orphanWait:
		o.queue.AddAfter(key, d.at.Sub(o.now()))
		return nil
	case orphanKeep:
		return nil
	}
	return o.remove(ctx, key)
}

// lookupIn looks registrations of namespace ns up through r.
func lookupIn(r client.Reader, ns string) registrationLookup {
	return func(ctx context.Context, name string) (*runtimev1alpha1.WorkloadAutoRegistration, error) {
		war := &runtimev1alpha1.WorkloadAutoRegistration{}
		err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, war)
		switch {
		case err == nil:
			return war, nil
		case apierrors.IsNotFound(err):
			return nil, nil
		default:
			return nil, fmt.Errorf("read registration %s/%s: %w", ns, name, err)
		}
	}
}

// remove deletes an orphan after judging it again from the API server: the
// object and its registration as they are now. The delete carries the
// object's UID and resourceVersion as preconditions, so an object changed
// in between is judged again instead.
func (o *orphanCollector) remove(ctx context.Context, key types.NamespacedName) error {
	var removed client.Object
	var d orphanDecision
	err := o.writer.Do(ctx, func(ctx context.Context) error {
		cur := o.kind.newObject()
		if err := o.reader.Get(ctx, key, cur); err != nil {
			return err
		}
		if !o.kind.ours(cur) {
			return nil
		}
		var err error
		d, err = judgeOrphan(ctx, cur, o.now(), o.minAge, lookupIn(o.reader, key.Namespace))
		if err != nil || d.verdict != orphanRemove {
			return err
		}
		if err := o.removals.Wait(ctx); err != nil {
			return fmt.Errorf("wait for the removal rate limit: %w", err)
		}
		uid, rv := cur.GetUID(), cur.GetResourceVersion()
		if err := o.client.Delete(ctx, cur, client.Preconditions{UID: &uid, ResourceVersion: &rv}); err != nil {
			return err
		}
		removed = cur
		return nil
	})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("remove orphaned %s %s: %w", o.kind.name, key, err)
	case removed == nil:
		if d.verdict == orphanWait {
			o.queue.AddAfter(key, d.at.Sub(o.now()))
		}
		return nil
	}
	o.metrics.orphanRemoved(o.kind.name)
	o.log.Warn("removed an object whose registration is gone", "kind", o.kind.name, "object", key.String(), "reason", d.why)
	return nil
}
