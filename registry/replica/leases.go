package replica

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	coordinationinformers "k8s.io/client-go/informers/coordination/v1"
	"k8s.io/client-go/kubernetes"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
)

// State is what the Lease of an endpoint replica says about it.
type State struct {
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

// HeldSince reports whether a connection established at connectedAt can be
// held by the replica's current process. Stored connection timestamps have
// one-second precision, so only a process started in a later second than the
// connection proves the connection belonged to an earlier process.
func (s State) HeldSince(connectedAt *metav1.Time) bool {
	if connectedAt == nil || s.Started.IsZero() {
		return true
	}
	return !s.Started.Truncate(time.Second).After(connectedAt.Time)
}

// Leases answers, from an informer of the replica Leases in one
// namespace, whether an endpoint replica is alive, and tells subscribers when
// a replica's Lease is deleted or expires.
type Leases struct {
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

// NewLeases returns a Leases for the Leases in namespace. Run
// it before asking it anything. now defaults to time.Now, log to
// slog.Default().
func NewLeases(kube kubernetes.Interface, namespace string, now func() time.Time, log *slog.Logger) *Leases {
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.Default()
	}
	selector := labels.SelectorFromSet(labels.Set{LabelLease: "true"}).String()
	inf := coordinationinformers.NewFilteredLeaseInformer(kube, namespace, 0, toolscache.Indexers{}, func(o *metav1.ListOptions) {
		o.LabelSelector = selector
	})
	return &Leases{
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
func (r *Leases) Run(ctx context.Context) error {
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
func (r *Leases) WaitForSync(ctx context.Context) bool {
	return toolscache.WaitForCacheSync(ctx.Done(), r.informer.HasSynced)
}

// Lookup returns what replica's Lease says, as the informer cache has it.
func (r *Leases) Lookup(replica string) State {
	if replica == "" {
		return State{}
	}
	lease, err := r.lister.Get(LeaseName(replica))
	if err != nil {
		return State{}
	}
	return r.stateOf(lease, replica)
}

// LookupLive returns what replica's Lease says, read from the API server: a
// replica that has just started may not be in the cache yet.
func (r *Leases) LookupLive(ctx context.Context, replica string) (State, error) {
	if replica == "" {
		return State{}, nil
	}
	lease, err := r.client.Get(ctx, LeaseName(replica), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return State{}, nil
	}
	if err != nil {
		return State{}, fmt.Errorf("read the Lease of replica %s: %w", replica, err)
	}
	return r.stateOf(lease, replica), nil
}

func (r *Leases) stateOf(lease *coordinationv1.Lease, replica string) State {
	if ptr.Deref(lease.Spec.HolderIdentity, "") != replica {
		return State{}
	}
	st := State{Found: true, Expiry: leaseExpiry(lease)}
	if lease.Spec.AcquireTime != nil {
		st.Started = lease.Spec.AcquireTime.Time
	}
	st.Alive = lease.DeletionTimestamp == nil && st.Expiry.After(r.now())
	return st
}

// OthersAlive reports whether a replica other than self holds a Lease that
// has not expired, as the informer cache has it.
func (r *Leases) OthersAlive(self string) bool {
	for _, obj := range r.informer.GetStore().List() {
		lease, ok := obj.(*coordinationv1.Lease)
		if !ok {
			continue
		}
		holder := ptr.Deref(lease.Spec.HolderIdentity, "")
		if holder != "" && holder != self && lease.Name == LeaseName(holder) && r.stateOf(lease, holder).Alive {
			return true
		}
	}
	return false
}

// IsAlive reports whether replica holds a Lease that has not expired.
func (r *Leases) IsAlive(replica string) bool { return r.Lookup(replica).Alive }

// OnGone calls fn with a replica's name whenever its Lease is deleted or
// expires without renewal. fn must not block. The returned function removes fn.
func (r *Leases) OnGone(fn func(replica string)) (remove func()) {
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

func (r *Leases) notify(replica string) {
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
func (r *Leases) watchExpiry(obj any) {
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
func (r *Leases) checkExpiry(name string) {
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
