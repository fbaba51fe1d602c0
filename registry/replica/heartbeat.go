package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/ptr"

	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/write"
)

// Replica Leases: every onboarding endpoint replica keeps a
// coordination.k8s.io/v1 Lease named LeaseName(replica) while it runs,
// so that other replicas can tell whether the replica recorded as holding a
// workload's ADS stream (status.connection.replica) still exists.
const (
	// LabelLease marks the Leases of endpoint replicas (value "true").
	LabelLease = "onboarding.tetrate.io/replica-lease"
	// leasePrefix starts the name of every replica Lease.
	leasePrefix = "embark-replica-"
	// DefaultLeaseDuration is how long a replica Lease stays valid
	// after its last renewal.
	DefaultLeaseDuration = 40 * time.Second
	// DefaultRenewInterval is how often a replica renews its Lease.
	DefaultRenewInterval = 10 * time.Second
)

// LeaseName returns the name of the Lease of an endpoint replica:
// embark-replica-<replica>, made a valid object name deterministically.
func LeaseName(replica string) string {
	return registry.Shorten(leasePrefix+replica, validation.DNS1123SubdomainMaxLength)
}

// Heartbeat keeps one replica's Lease: created (or taken over, as a new
// incarnation) by the first Renew, renewed by Run, deleted by Release on
// clean shutdown. Give it a write.Writer of its own, so that a saturated
// write budget never lets the Lease lapse.
type Heartbeat struct {
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

// HeartbeatOptions configures a Heartbeat. Every field documents its
// default.
type HeartbeatOptions struct {
	// Leases reads and writes the Lease. Required.
	Leases coordinationv1client.LeasesGetter
	// Namespace and Replica name the Lease (embark-replica-<replica> in
	// namespace). Required.
	Namespace, Replica string
	// Duration is how long the Lease is valid after each renewal, and
	// Interval how often it is renewed. Required, Interval < Duration.
	Duration, Interval time.Duration
	// Writer is the heartbeat's write budget: give it one of its own, so
	// that a saturated budget never lets the Lease lapse. Default: a
	// write.Writer of its own with write.Options' defaults.
	Writer *write.Writer
	// Clock tells the time. Default time.Now.
	Clock func() time.Time
	// Logger logs renewals that fail. Default slog.Default().
	Logger *slog.Logger
}

// NewHeartbeat returns the Heartbeat of the replica's Lease.
func NewHeartbeat(o HeartbeatOptions) (*Heartbeat, error) {
	if o.Leases == nil || o.Namespace == "" || o.Replica == "" {
		return nil, errors.New("replica: HeartbeatOptions.Leases, Namespace and Replica are required")
	}
	if o.Duration <= 0 || o.Interval <= 0 || o.Interval >= o.Duration {
		return nil, fmt.Errorf("replica: heartbeat interval %s must be positive and below the Lease duration %s", o.Interval, o.Duration)
	}
	if o.Writer == nil {
		o.Writer = write.New(write.Options{})
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	name := LeaseName(o.Replica)
	return &Heartbeat{
		leases: o.Leases, namespace: o.Namespace, replica: o.Replica, name: name,
		duration: o.Duration, interval: o.Interval, now: o.Clock, log: o.Logger.With("lease", o.Namespace+"/"+name), writer: o.Writer,
	}, nil
}

// Renew creates or renews the Lease.
func (h *Heartbeat) Renew(ctx context.Context) error {
	now := h.now()
	if h.started.IsZero() {
		h.started = now
	}
	seconds := int32(max(1, h.duration.Round(time.Second)/time.Second))
	err := h.writer.Do(ctx, func(ctx context.Context) error {
		cur, err := h.leases.Leases(h.namespace).Get(ctx, h.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			lease := &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: h.name, Namespace: h.namespace, Labels: map[string]string{LabelLease: "true"}},
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
		lease.Labels[LabelLease] = "true"
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

// Run renews the Lease every interval until ctx ends. A failed renewal is
// logged and tried again after at most a second (renewRetry), not at the
// next tick, so that the Lease is renewed right after an API server outage;
// the Lease's duration is several intervals, so a short outage does not
// make the replica look gone.
func (h *Heartbeat) Run(ctx context.Context) {
	t := time.NewTimer(h.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next := h.interval
		if err := h.Renew(ctx); err != nil && ctx.Err() == nil {
			h.log.Error("renew replica Lease; other replicas will consider this one gone if it expires", "error", err)
			next = min(next, renewRetry)
		}
		t.Reset(next)
	}
}

// renewRetry is the longest wait before a failed Lease renewal is tried again.
const renewRetry = time.Second

// Release deletes the Lease this incarnation holds, so that the sweeper
// treats the replica's connections as gone at once rather than after the
// Lease expires. It is called on clean shutdown, after ctx ended.
func (h *Heartbeat) Release(ctx context.Context) {
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
