package lifecycle

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/replica"
	"github.com/embark-mesh/embark/registry/write"
)

// Reasons the lifecycle writes (conditions) and records (Events).
const (
	// ReasonReplicaGone (AgentConnected=False): the endpoint replica holding
	// the workload's stream is gone (its Lease was deleted or expired, or it
	// restarted), so the stream is gone too.
	ReasonReplicaGone = "ReplicaGone"
	// ReasonGracePeriodExpired (Event): the registration was removed because
	// its workload had no stream for the grace period.
	ReasonGracePeriodExpired = "GracePeriodExpired"
)

// Cause label values of embark_registry_grace_period_removals_total.
const (
	causeDisconnected   = "disconnected"
	causeNeverConnected = "never_connected"
	causeReplicaGone    = "replica_gone"
)

// verdict is what the sweeper does with a registration.
type verdict int

const (
	// verdictKeep: the workload is connected to a live replica.
	verdictKeep verdict = iota
	// verdictWait: no stream, still within the grace period; look again at decision.at.
	verdictWait
	// verdictMarkGone: connected to a replica that is gone; record the disconnect.
	verdictMarkGone
	// verdictRemove: no stream for the grace period.
	verdictRemove
)

// decision is the sweeper's verdict on a registration at one instant.
type decision struct {
	verdict verdict
	// since is when the workload's last stream ended (or it registered).
	since time.Time
	// at is the end of the grace period (wait, remove).
	at time.Time
	// cause labels removals.
	cause string
	// why says it in words.
	why string
}

// decide judges a registration from the timestamps stored in it, so that any
// replica, also after a restart, reaches the same verdict. Where two stored
// timestamps could mark the start of the grace period the later one counts,
// and since stored timestamps have one-second precision (the true instant
// lies anywhere in the stored second) the grace period runs from the end of
// that second: a removal may come up to a second late, never early.
func decide(war *runtimev1alpha1.WorkloadAutoRegistration, now time.Time, grace time.Duration, replicas func(string) replica.State) decision {
	if war.DeletionTimestamp != nil {
		return decision{verdict: verdictKeep}
	}
	cond := meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected)
	conn := war.Status.Connection
	if conn == nil {
		conn = &runtimev1alpha1.ConnectionStatus{}
	}
	var d decision
	switch {
	case cond != nil && cond.Status == metav1.ConditionTrue:
		st := replicas(conn.Replica)
		switch {
		case conn.Replica == "":
			return decision{verdict: verdictMarkGone, why: "connected, but no endpoint replica is recorded as holding the connection"}
		case !st.Found:
			return decision{verdict: verdictMarkGone, why: fmt.Sprintf("endpoint replica %s holding the connection is gone (it has no Lease %s)", conn.Replica, replica.LeaseName(conn.Replica))}
		case !st.Alive:
			return decision{verdict: verdictMarkGone, why: fmt.Sprintf("endpoint replica %s holding the connection is gone (its Lease %s expired at %s)", conn.Replica, replica.LeaseName(conn.Replica), st.Expiry.UTC().Format(time.RFC3339))}
		case !st.HeldSince(conn.ConnectedAt):
			return decision{verdict: verdictMarkGone, why: fmt.Sprintf("endpoint replica %s restarted at %s, after the connection was established", conn.Replica, st.Started.UTC().Format(time.RFC3339))}
		}
		return decision{verdict: verdictKeep}
	case cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason != runtimev1alpha1.ReasonAgentNeverConnected:
		d.since = cond.LastTransitionTime.Time
		if conn.DisconnectedAt != nil && conn.DisconnectedAt.After(d.since) {
			d.since = conn.DisconnectedAt.Time
		}
		d.cause = causeDisconnected
		if cond.Reason == ReasonReplicaGone {
			d.cause = causeReplicaGone
		}
		d.why = fmt.Sprintf("disconnected since %s", d.since.UTC().Format(time.RFC3339))
		if conn.Replica != "" {
			d.why += " (last connected to replica " + conn.Replica + ")"
		}
	default:
		// Never connected (no condition, AgentNeverConnected or Unknown).
		// The grace period runs from the registration: writing
		// AgentNeverConnected does not extend it.
		d.since = war.CreationTimestamp.Time
		if cond != nil && cond.Reason != runtimev1alpha1.ReasonAgentNeverConnected && cond.LastTransitionTime.After(d.since) {
			d.since = cond.LastTransitionTime.Time
		}
		d.cause = causeNeverConnected
		d.why = fmt.Sprintf("registered at %s and never connected", war.CreationTimestamp.UTC().Format(time.RFC3339))
	}
	d.at = d.since.Truncate(time.Second).Add(time.Second + grace)
	d.verdict = verdictWait
	if !now.Before(d.at) {
		d.verdict = verdictRemove
	}
	return d
}

// sweeper removes registrations whose workload had no ADS stream for the
// grace period. Each registration is queued for the instant its grace period
// ends, on every change, when the replica holding its stream goes away, and
// on a periodic resync.
type sweeper struct {
	client   client.Client
	reader   client.Reader
	cache    cache.Cache
	leases   *replica.Leases
	grace    time.Duration
	resync   time.Duration
	workers  int
	removals *rate.Limiter
	writer   *write.Writer
	recorder record.EventRecorder
	metrics  *Metrics
	log      *slog.Logger
	now      func() time.Time

	// neverConnectedAfter: see Options.NeverConnectedAfter.
	neverConnectedAfter time.Duration
	// leaseGrace is how long after this sweeper started leading an expired
	// replica Lease is not yet taken as proof that its replica is gone
	// (Options.ReplicaLeaseDuration). leadingSince is set by run.
	leaseGrace   time.Duration
	leadingSince time.Time

	queue queue
}

// run sweeps until ctx ends.
func (s *sweeper) run(ctx context.Context) error {
	// A leader starting now may have been cut off from the API server (an
	// outage also ends the previous leader's term), and while nobody
	// could reach it nobody could renew a Lease either: an expired Lease
	// proves its replica gone only once the replica had a full Lease
	// duration, counted from now, to renew it (see replicaState).
	s.leadingSince = s.now()
	l := newLoop(s.cache, "sweep", s.process, s.workers, s.resync, s.log)
	defer l.ShutDown()
	s.queue = l
	if err := watchRegistrations(ctx, l, s.cache); err != nil {
		return err
	}
	removeGone := s.leases.OnGone(func(gone string) { s.enqueueReplica(ctx, gone) })
	defer removeGone()
	// Judge again, once the grace is over, the registrations it kept.
	queue := s.queue
	graceOver := time.AfterFunc(s.leaseGrace+100*time.Millisecond, func() {
		list := &runtimev1alpha1.WorkloadAutoRegistrationList{}
		if err := s.cache.List(ctx, list); err != nil {
			return // ctx ended; the periodic resync covers the rest
		}
		for i := range list.Items {
			if c := list.Items[i].Status.Connection; c != nil && c.Replica != "" && c.DisconnectedAt == nil {
				queue.Add(client.ObjectKeyFromObject(&list.Items[i]))
			}
		}
	})
	defer graceOver.Stop()
	l.Run(ctx)
	return nil
}

// enqueueReplica queues the registrations connected to a replica that went away.
func (s *sweeper) enqueueReplica(ctx context.Context, gone string) {
	list := &runtimev1alpha1.WorkloadAutoRegistrationList{}
	if err := s.cache.List(ctx, list); err != nil {
		s.log.Error("list registrations of a gone replica", "gone", gone, "error", err)
		return
	}
	for i := range list.Items {
		if c := list.Items[i].Status.Connection; c != nil && c.Replica == gone {
			s.queue.Add(client.ObjectKeyFromObject(&list.Items[i]))
		}
	}
}

func (s *sweeper) decide(war *runtimev1alpha1.WorkloadAutoRegistration) decision {
	return decide(war, s.now(), s.grace, func(r string) replica.State { return s.replicaState(s.leases.Lookup(r)) })
}

// replicaState is st as the sweeper judges it: a Lease that expired before
// this sweeper had led for leaseGrace counts as alive until then. Its
// replica could not renew it while the API server was unreachable (the
// outage that also cost the previous leader its term), so after an outage
// every replica gets a full Lease duration to renew before its workloads
// are marked disconnected. A missing Lease (deleted on clean shutdown) is
// not affected.
func (s *sweeper) replicaState(st replica.State) replica.State {
	if st.Found && !st.Alive {
		if until := s.leadingSince.Add(s.leaseGrace); until.After(s.now()) {
			st.Alive, st.Expiry = true, until
		}
	}
	return st
}

// process acts on one registration as the cache shows it.
func (s *sweeper) process(ctx context.Context, key types.NamespacedName) error {
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := s.cache.Get(ctx, key, war); err != nil {
		return client.IgnoreNotFound(err)
	}
	d := s.decide(war)
	switch d.verdict {
	case verdictKeep:
		return nil
	case verdictWait:
		at := d.at
		if d.cause == causeNeverConnected {
			due, when := neverConnectedDue(war, s.now(), s.neverConnectedAfter)
			if due {
				if err := s.markNeverConnected(ctx, war); err != nil {
					return err
				}
			} else if !when.IsZero() && when.Before(at) {
				at = when
			}
		}
		s.queue.AddAfter(key, at.Sub(s.now()))
		return nil
	case verdictMarkGone:
		return s.markGone(ctx, war)
	default:
		return s.remove(ctx, key)
	}
}

// markGone records that the replica holding a workload's stream is gone:
// AgentConnected=False (ReplicaGone) and disconnectedAt=now, so that the
// grace period runs from a timestamp stored in the registration. The
// replica that holds a stream is the only writer of connection state; once
// it is gone, the sweeper leader writes in its place, with the
// resourceVersion precondition so that a reconnect to another replica wins.
func (s *sweeper) markGone(ctx context.Context, cached *runtimev1alpha1.WorkloadAutoRegistration) error {
	key := client.ObjectKeyFromObject(cached)
	// Confirm with the API server: the cache may not have the Lease of a
	// replica that has just started yet.
	var holder string
	if cached.Status.Connection != nil {
		holder = cached.Status.Connection.Replica
	}
	live, err := s.leases.LookupLive(ctx, holder)
	if err != nil {
		return err
	}
	lookup := func(r string) replica.State {
		if r == holder {
			return s.replicaState(live)
		}
		return s.replicaState(s.leases.Lookup(r))
	}
	var why string
	written, err := registry.UpdateRegistrationStatus(ctx, s.writer, s.client, s.reader, cached, func(cur *runtimev1alpha1.WorkloadAutoRegistration) bool {
		if cur.Status.Connection != nil && cur.Status.Connection.Replica != holder {
			return false // changed hands: judged again from the queue
		}
		d := decide(cur, s.now(), s.grace, lookup)
		if d.verdict != verdictMarkGone {
			return false
		}
		why = d.why
		now := metav1.NewTime(s.now())
		conn := cur.Status.Connection
		if conn == nil {
			conn = &runtimev1alpha1.ConnectionStatus{}
			cur.Status.Connection = conn
		}
		// A disconnect recorded after the current connection began is
		// kept; an older one is stale.
		if conn.DisconnectedAt == nil || (conn.ConnectedAt != nil && conn.DisconnectedAt.Before(conn.ConnectedAt)) {
			conn.DisconnectedAt = &now
		}
		meta.SetStatusCondition(&cur.Status.Conditions, metav1.Condition{
			Type: runtimev1alpha1.ConditionAgentConnected, Status: metav1.ConditionFalse, Reason: ReasonReplicaGone,
			Message: why, ObservedGeneration: cur.Generation, LastTransitionTime: now,
		})
		return true
	})
	if err != nil {
		return fmt.Errorf("mark %s disconnected: %w", key, err)
	}
	if written {
		s.metrics.replicaGone()
		s.log.Info("marked registration disconnected: its endpoint replica is gone", "registration", key.String(), "reason", why, "gracePeriod", s.grace)
		s.recorder.Eventf(cached, corev1.EventTypeWarning, ReasonReplicaGone, "Marked disconnected: %s; removed unless it reconnects within %s", why, s.grace)
	}
	// The status update brings the registration back through the queue; the
	// delayed add covers a write that did not happen because the live object
	// said otherwise while the cache lags.
	s.queue.AddAfter(key, replicaGoneRecheckBackoff)
	return nil
}

// remove deletes a registration whose grace period is over, after checking
// the live object: the delete carries its UID and resourceVersion as
// preconditions, so a reconnect written in between wins.
func (s *sweeper) remove(ctx context.Context, key types.NamespacedName) error {
	var removed *runtimev1alpha1.WorkloadAutoRegistration
	var live decision
	err := s.writer.Do(ctx, func(ctx context.Context) error {
		cur := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := s.reader.Get(ctx, key, cur); err != nil {
			return err
		}
		live = s.decide(cur)
		if live.verdict != verdictRemove {
			return nil
		}
		if err := s.removals.Wait(ctx); err != nil {
			return fmt.Errorf("wait for the removal rate limit: %w", err)
		}
		uid, rv := cur.UID, cur.ResourceVersion
		err := s.client.Delete(ctx, cur, client.Preconditions{UID: &uid, ResourceVersion: &rv}, client.PropagationPolicy(metav1.DeletePropagationBackground))
		if err == nil {
			removed = cur
		}
		return err
	})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("remove expired registration %s: %w", key, err)
	case removed == nil:
		// The live object says otherwise (e.g. it reconnected): judge again.
		switch live.verdict {
		case verdictWait:
			s.queue.AddAfter(key, live.at.Sub(s.now()))
		case verdictMarkGone:
			s.queue.AddAfter(key, replicaGoneRecheckBackoff)
		}
		return nil
	}
	s.metrics.removed(live.cause)
	s.log.Info("removed registration: no ADS stream for the grace period", "registration", key.String(), "cause", live.cause, "reason", live.why, "gracePeriod", s.grace)
	s.recorder.Eventf(removed, corev1.EventTypeNormal, ReasonGracePeriodExpired, "Removed with its WorkloadEntry: %s, longer than the grace period %s", live.why, s.grace)
	return nil
}
