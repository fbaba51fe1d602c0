package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	coordinationinformers "k8s.io/client-go/informers/coordination/v1"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"

	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/write"
)

// Replica Leases: every onboarding endpoint replica keeps a
// coordination.k8s.io/v1 Lease named ReplicaLeaseName(replica) while it runs,
// so that other replicas can tell whether the replica recorded as holding a
// workload's ADS stream (status.connection.replica) still exists.
const (
	// LabelReplicaLease marks the Leases of endpoint replicas (value "true").
	LabelReplicaLease = "onboarding.tetrate.io/replica-lease"
	// replicaLeasePrefix starts the name of every replica Lease.
	replicaLeasePrefix = "embark-replica-"
	// DefaultReplicaLeaseDuration is how long a replica Lease stays valid
	// after its last renewal.
	DefaultReplicaLeaseDuration = 40 * time.Second
	// DefaultReplicaRenewInterval is how often a replica renews its Lease.
	DefaultReplicaRenewInterval = 10 * time.Second
)

// ReplicaLeaseName returns the name of the Lease of an endpoint replica:
// embark-replica-<replica>, made a valid object name deterministically.
func ReplicaLeaseName(replica string) string {
	return registry.Shorten(replicaLeasePrefix+replica, validation.DNS1123SubdomainMaxLength)
}

// replicaHeartbeat keeps this replica's Lease: created (or taken over, as a
// new incarnation) at start, renewed periodically, deleted on clean shutdown.
type replicaHeartbeat struct {
	leases    coordinationv1client.LeasesGetter
	namespace string
	replica   string
	name      string
	duration  time.Duration
	interval  time.Duration
	now       func() time.Time
	log       *slog.Logger
	writer    *write.Writer

	// started is this incarnation's start, written as the Lease's
	// acquireTime: a connection established before it was held by an
	// earlier process of the same name.
	started time.Time
	// uid is the UID of the Lease this incarnation last wrote.
	uid types.UID
}

func newReplicaHeartbeat(leases coordinationv1client.LeasesGetter, namespace, replica string, duration, interval time.Duration, now func() time.Time, log *slog.Logger, w *write.Writer) *replicaHeartbeat {
	return &replicaHeartbeat{
		leases: leases, namespace: namespace, replica: replica, name: ReplicaLeaseName(replica),
		duration: duration, interval: interval, now: now, log: log.With("lease", namespace+"/"+ReplicaLeaseName(replica)), writer: w,
	}
}

// renew creates or renews the Lease.
func (h *replicaHeartbeat) renew(ctx context.Context) error {
	now := h.now()
	if h.started.IsZero() {
		h.started = now
	}
	seconds := int32(max(1, h.duration.Round(time.Second)/time.Second))
	err := h.writer.Do(ctx, func(ctx context.Context) error {
		cur, err := h.leases.Leases(h.namespace).Get(ctx, h.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			lease := &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: h.name, Namespace: h.namespace, Labels: map[string]string{LabelReplicaLease: "true"}},
				Spec: coordinationv1.LeaseSpec{
					HolderIdentity:       ptr.To(h.replica),
					LeaseDurationSeconds: ptr.To(seconds),
					AcquireTime:          &metav1.MicroTime{Time: h.started},
					RenewTime:            &metav1.MicroTime{Time: now},
				},
			}
			created, err := h.leases.Leases(h.namespace).Create(ctx, lease, metav1.CreateOptions{})
			if err != nil {
				return err
			}
			h.uid = created.UID
			return nil
		}
		if err != nil {
			return err
		}
		lease := cur.DeepCopy()
		if lease.Labels == nil {
			lease.Labels = map[string]string{}
		}
		lease.Labels[LabelReplicaLease] = "true"
		if lease.UID != h.uid || ptr.Deref(lease.Spec.HolderIdentity, "") != h.replica {
			// Left by an earlier process of this replica name (or taken
			// by someone else): this incarnation takes it over.
			lease.Spec.HolderIdentity = ptr.To(h.replica)
			lease.Spec.AcquireTime = &metav1.MicroTime{Time: h.started}
			lease.Spec.LeaseTransitions = ptr.To(ptr.Deref(lease.Spec.LeaseTransitions, 0) + 1)
		}
		lease.Spec.LeaseDurationSeconds = ptr.To(seconds)
		lease.Spec.RenewTime = &metav1.MicroTime{Time: now}
		updated, err := h.leases.Leases(h.namespace).Update(ctx, lease, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		h.uid = updated.UID
		return nil
	})
	if err != nil {
		return fmt.Errorf("renew replica Lease %s/%s: %w", h.namespace, h.name, err)
	}
	return nil
}

// run renews the Lease every interval until ctx ends. A failed renewal is
// logged and tried again after at most a second (renewRetry), not at the
// next tick, so that the Lease is renewed right after an API server outage;
// the Lease's duration is several intervals, so a short outage does not
// make the replica look gone.
func (h *replicaHeartbeat) run(ctx context.Context) {
	t := time.NewTimer(h.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next := h.interval
		if err := h.renew(ctx); err != nil && ctx.Err() == nil {
			h.log.Error("renew replica Lease; other replicas will consider this one gone if it expires", "error", err)
			next = min(next, renewRetry)
		}
		t.Reset(next)
	}
}

// renewRetry is the longest wait before a failed Lease renewal is tried again.
const renewRetry = time.Second

// release deletes the Lease this incarnation holds, so that the sweeper
// treats the replica's connections as gone at once rather than after the
// Lease expires. It is called on clean shutdown, after ctx ended.
func (h *replicaHeartbeat) release(ctx context.Context) {
	if h.uid == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	uid := h.uid
	err := h.leases.Leases(h.namespace).Delete(ctx, h.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		h.log.Error("delete replica Lease on shutdown; it expires by itself", "error", err)
		return
	}
	h.log.Info("released replica Lease")
}

// ReplicaState is what the Lease of an endpoint replica says about it.
type ReplicaState struct {
	// Found is true when the replica has a Lease.
	Found bool
	// Alive is true when the Lease exists and has not expired.
	Alive bool
	// Expiry is when the Lease expires (or expired) unless renewed.
	Expiry time.Time
	// Started is when the current process of the replica took the Lease
	// (its acquireTime); zero when unknown.
	Started time.Time
}

// heldSince reports whether a connection established at connectedAt can be
// held by the replica's current process. Stored connection timestamps have
// one-second precision, so only a process started in a later second than the
// connection proves the connection belonged to an earlier process.
func (s ReplicaState) heldSince(connectedAt *metav1.Time) bool {
	if connectedAt == nil || s.Started.IsZero() {
		return true
	}
	return !s.Started.Truncate(time.Second).After(connectedAt.Time)
}

// ReplicaLeases answers, from an informer of the replica Leases in one
// namespace, whether an endpoint replica is alive, and tells subscribers when
// a replica's Lease is deleted or expires.
type ReplicaLeases struct {
	informer toolscache.SharedIndexInformer
	lister   coordinationlisters.LeaseNamespaceLister
	client   coordinationv1client.LeaseInterface
	now      func() time.Time
	log      *slog.Logger
	// expiry rechecks a Lease (by name) when it is due to expire.
	expiry workqueue.TypedDelayingInterface[string]

	mu          sync.Mutex
	nextHandler int
	handlers    map[int]func(replica string)
}

// NewReplicaLeases returns a ReplicaLeases for the Leases in namespace. Run
// it before asking it anything. now defaults to time.Now, log to
// slog.Default().
func NewReplicaLeases(kube kubernetes.Interface, namespace string, now func() time.Time, log *slog.Logger) *ReplicaLeases {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.Default()
	}
	selector := labels.SelectorFromSet(labels.Set{LabelReplicaLease: "true"}).String()
	inf := coordinationinformers.NewFilteredLeaseInformer(kube, namespace, 0, toolscache.Indexers{}, func(o *metav1.ListOptions) {
		o.LabelSelector = selector
	})
	return &ReplicaLeases{
		informer: inf,
		lister:   coordinationlisters.NewLeaseLister(inf.GetIndexer()).Leases(namespace),
		client:   kube.CoordinationV1().Leases(namespace),
		now:      now,
		log:      log,
		expiry:   workqueue.NewTypedDelayingQueue[string](),
		handlers: map[int]func(string){},
	}
}

// Run runs the informer and the expiry watch until ctx ends. Call it once.
func (r *ReplicaLeases) Run(ctx context.Context) error {
	reg, err := r.informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.watchExpiry(obj) },
		UpdateFunc: func(_, obj any) { r.watchExpiry(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if lease, ok := obj.(*coordinationv1.Lease); ok {
				r.notify(ptr.Deref(lease.Spec.HolderIdentity, ""))
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watch replica Leases: %w", err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer func() { _ = r.informer.RemoveEventHandler(reg) }()
	wg.Go(func() {
		<-ctx.Done()
		r.expiry.ShutDown()
	})
	wg.Go(func() { r.informer.RunWithContext(ctx) })
	for {
		name, shutdown := r.expiry.Get()
		if shutdown {
			return nil
		}
		r.checkExpiry(name)
		r.expiry.Done(name)
	}
}

// WaitForSync waits until the informer has listed the Leases.
func (r *ReplicaLeases) WaitForSync(ctx context.Context) bool {
	return toolscache.WaitForCacheSync(ctx.Done(), r.informer.HasSynced)
}

// Lookup returns what replica's Lease says, as the informer cache has it.
func (r *ReplicaLeases) Lookup(replica string) ReplicaState {
	if replica == "" {
		return ReplicaState{}
	}
	lease, err := r.lister.Get(ReplicaLeaseName(replica))
	if err != nil {
		return ReplicaState{}
	}
	return r.stateOf(lease, replica)
}

// LookupLive returns what replica's Lease says, read from the API server: a
// replica that has just started may not be in the cache yet.
func (r *ReplicaLeases) LookupLive(ctx context.Context, replica string) (ReplicaState, error) {
	if replica == "" {
		return ReplicaState{}, nil
	}
	lease, err := r.client.Get(ctx, ReplicaLeaseName(replica), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ReplicaState{}, nil
	}
	if err != nil {
		return ReplicaState{}, fmt.Errorf("read the Lease of replica %s: %w", replica, err)
	}
	return r.stateOf(lease, replica), nil
}

func (r *ReplicaLeases) stateOf(lease *coordinationv1.Lease, replica string) ReplicaState {
	if ptr.Deref(lease.Spec.HolderIdentity, "") != replica {
		return ReplicaState{}
	}
	st := ReplicaState{Found: true, Expiry: leaseExpiry(lease)}
	if lease.Spec.AcquireTime != nil {
		st.Started = lease.Spec.AcquireTime.Time
	}
	st.Alive = lease.DeletionTimestamp == nil && st.Expiry.After(r.now())
	return st
}

// IsAlive reports whether replica holds a Lease that has not expired.
func (r *ReplicaLeases) IsAlive(replica string) bool { return r.Lookup(replica).Alive }

// OnGone calls fn with a replica's name whenever its Lease is deleted or
// expires without renewal. fn must not block. The returned function removes fn.
func (r *ReplicaLeases) OnGone(fn func(replica string)) (remove func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := r.nextHandler
	r.nextHandler++
	r.handlers[id] = fn
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.handlers, id)
	}
}

func (r *ReplicaLeases) notify(replica string) {
	if replica == "" {
		return
	}
	r.mu.Lock()
	fns := make([]func(string), 0, len(r.handlers))
	for _, fn := range r.handlers {
		fns = append(fns, fn)
	}
	r.mu.Unlock()
	for _, fn := range fns {
		fn(replica)
	}
}

// watchExpiry schedules a check of a Lease for when it is due to expire.
func (r *ReplicaLeases) watchExpiry(obj any) {
	lease, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	// A little after the expiry, so that the check sees it expired.
	r.expiry.AddAfter(lease.Name, leaseExpiry(lease).Sub(r.now())+100*time.Millisecond)
}

// checkExpiry tells subscribers about an expired Lease, or checks again at
// its new expiry when it was renewed (the delaying queue keeps only the
// earliest time of an item, so renewals do not move it).
func (r *ReplicaLeases) checkExpiry(name string) {
	lease, err := r.lister.Get(name)
	if err != nil {
		return // deleted: the delete handler told subscribers
	}
	expiry := leaseExpiry(lease)
	if now := r.now(); expiry.After(now) {
		r.expiry.AddAfter(name, expiry.Sub(now)+100*time.Millisecond)
		return
	}
	r.log.Info("endpoint replica Lease expired", "lease", lease.Namespace+"/"+lease.Name, "replica", ptr.Deref(lease.Spec.HolderIdentity, ""), "expiredAt", expiry)
	r.notify(ptr.Deref(lease.Spec.HolderIdentity, ""))
}

// leaseExpiry is when a Lease expires unless renewed.
func leaseExpiry(lease *coordinationv1.Lease) time.Time {
	var last time.Time
	switch {
	case lease.Spec.RenewTime != nil:
		last = lease.Spec.RenewTime.Time
	case lease.Spec.AcquireTime != nil:
		last = lease.Spec.AcquireTime.Time
	default:
		return time.Time{}
	}
	return last.Add(time.Duration(ptr.Deref(lease.Spec.LeaseDurationSeconds, 0)) * time.Second)
}

// errNoReplica is returned for a Lifecycle without a replica name.
var errNoReplica = errors.New("registry: the replica name is required")
