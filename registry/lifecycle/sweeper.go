package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
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

// SweeperLeaseName is the Lease that elects the replica that sweeps.
const SweeperLeaseName = "embark-sweeper"

// Defaults of LifecycleOptions.
const (
	DefaultGracePeriod        = 5 * time.Minute
	DefaultRemovalQPS         = 20.0
	DefaultResyncPeriod       = time.Minute
	DefaultLeaseNamespace     = "istio-system"
	DefaultElectionDuration   = 15 * time.Second
	DefaultElectionRenew      = 10 * time.Second
	DefaultElectionRetry      = 2 * time.Second
	defaultLifecycleWorkers   = 2
	replicaGoneRecheckBackoff = time.Second
)

// Cause label values of embark_registry_grace_period_removals_total.
const (
	causeDisconnected   = "disconnected"
	causeNeverConnected = "never_connected"
	causeReplicaGone    = "replica_gone"
)

// LifecycleOptions configures a Lifecycle. Every field documents its default.
type LifecycleOptions struct {
	// Client writes registration status and deletes registrations. Required.
	Client client.Client
	// APIReader reads the live registration right before a write or a
	// removal. It should read from the API server, not a cache; the
	// resourceVersion precondition keeps a stale read safe either way.
	// Default: Client.
	APIReader client.Reader
	// Cache is the informer cache registrations and WorkloadGroups are read
	// from. Required.
	Cache cache.Cache
	// Kube is used for the replica Leases and the sweeper election. Required.
	Kube kubernetes.Interface
	// Replica names this endpoint replica; it must be the name the xDS side
	// writes as status.connection.replica. Default: the host name.
	Replica string
	// LeaseNamespace holds the replica Leases and the sweeper election
	// Lease. Default: DefaultLeaseNamespace (istio-system).
	LeaseNamespace string
	// GracePeriod is how long a workload may have no ADS stream before its
	// registration and WorkloadEntry are removed. Default: 5m.
	GracePeriod time.Duration
	// NeverConnectedAfter is how long after registering a workload whose
	// sidecar never opened an ADS stream is shown AgentConnected=False,
	// reason AgentNeverConnected. It is removed at the end of the grace
	// period from its registration either way. Default: 1m
	// (DefaultNeverConnectedAfter).
	NeverConnectedAfter time.Duration
	// RemovalQPS bounds the steady rate of removals (token bucket).
	// Default: 20.
	RemovalQPS float64
	// RemovalBurst is how many removals may happen at once before
	// RemovalQPS applies (e.g. after an outage expired many registrations at
	// the same time). Default: 1.
	RemovalBurst int
	// ResyncPeriod is how often every registration is looked at again, on
	// top of the event-driven and end-of-grace-period checks. Default: 1m.
	ResyncPeriod time.Duration
	// ReplicaLeaseDuration is the validity of this replica's Lease (whole
	// seconds). Default: 40s.
	ReplicaLeaseDuration time.Duration
	// ReplicaRenewInterval is how often this replica renews its Lease.
	// Default: 10s.
	ReplicaRenewInterval time.Duration
	// Election times the sweeper election (client-go leaderelection).
	// Defaults: LeaseDuration 15s, RenewDeadline 10s, RetryPeriod 2s.
	Election ElectionTiming
	// RecreateQPS bounds how fast WorkloadEntries deleted by someone else
	// while their registration lives are created again (burst 10).
	// Default: 10.
	RecreateQPS float64
	// Workers is how many registrations the sweeper, the drift reconciler
	// and the entry reconciler each handle at once. Default: 2.
	Workers int
	// Writer is the replica's write budget, shared with every component
	// that writes (write.Writer). Default: a Writer of its own with
	// write.Options' defaults.
	Writer *write.Writer
	// Recorder records Events on registrations. Default: none recorded.
	Recorder record.EventRecorder
	// Metrics. Default: none recorded.
	Metrics *LifecycleMetrics
	// Logger. Default: slog.Default().
	Logger *slog.Logger
	// Clock for grace-period decisions and timestamps. Default: time.Now.
	Clock func() time.Time

	// Leading is more work run only on the sweeping replica, while it leads
	// (e.g. rollout.Controller.Run), started again after 5s when it fails.
	// Default: none.
	Leading []func(context.Context) error
}

// ElectionTiming times the sweeper's leader election.
type ElectionTiming struct {
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
}

func (o *LifecycleOptions) setDefaults() error {
	if o.Client == nil || o.Cache == nil || o.Kube == nil {
		return errors.New("registry: LifecycleOptions.Client, Cache and Kube are required")
	}
	if o.APIReader == nil {
		o.APIReader = o.Client
	}
	if o.Replica == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			return errNoReplica
		}
		o.Replica = host
	}
	if o.LeaseNamespace == "" {
		o.LeaseNamespace = DefaultLeaseNamespace
	}
	if o.GracePeriod <= 0 {
		o.GracePeriod = DefaultGracePeriod
	}
	if o.NeverConnectedAfter <= 0 {
		o.NeverConnectedAfter = DefaultNeverConnectedAfter
	}
	if o.RemovalQPS <= 0 {
		o.RemovalQPS = DefaultRemovalQPS
	}
	if o.RemovalBurst <= 0 {
		o.RemovalBurst = 1
	}
	if o.ResyncPeriod <= 0 {
		o.ResyncPeriod = DefaultResyncPeriod
	}
	if o.ReplicaLeaseDuration <= 0 {
		o.ReplicaLeaseDuration = DefaultReplicaLeaseDuration
	}
	if o.ReplicaRenewInterval <= 0 {
		o.ReplicaRenewInterval = DefaultReplicaRenewInterval
	}
	if o.ReplicaRenewInterval >= o.ReplicaLeaseDuration {
		return fmt.Errorf("registry: ReplicaRenewInterval %s must be shorter than ReplicaLeaseDuration %s", o.ReplicaRenewInterval, o.ReplicaLeaseDuration)
	}
	if o.Election.LeaseDuration <= 0 {
		o.Election.LeaseDuration = DefaultElectionDuration
	}
	if o.Election.RenewDeadline <= 0 {
		o.Election.RenewDeadline = DefaultElectionRenew
	}
	if o.Election.RetryPeriod <= 0 {
		o.Election.RetryPeriod = DefaultElectionRetry
	}
	if o.RecreateQPS <= 0 {
		o.RecreateQPS = DefaultRecreateQPS
	}
	if o.Workers <= 0 {
		o.Workers = defaultLifecycleWorkers
	}
	if o.Recorder == nil {
		o.Recorder = &record.FakeRecorder{} // drops events when Events is nil
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	return nil
}

// Lifecycle is the registry's background work on an endpoint replica: it
// keeps the replica's Lease, and, on the one replica elected through the
// embark-sweeper Lease, removes registrations whose workload had no ADS
// stream for the grace period, keeps every registration's
// WorkloadGroupOutOfDate condition, and creates again a WorkloadEntry deleted
// while its registration lives.
type Lifecycle struct {
	opts      LifecycleOptions
	leases    *ReplicaLeases
	heartbeat *replicaHeartbeat
	sweeper   *sweeper
	drift     *driftReconciler
	entries   *entryReconciler
	elector   *leaderelection.LeaderElector
	leadCh    chan context.Context
	ready     chan struct{}
}

// NewLifecycle returns a Lifecycle; Start runs it.
func NewLifecycle(opts LifecycleOptions) (*Lifecycle, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	log := opts.Logger.With("replica", opts.Replica)
	writes := write.OrDefault(opts.Writer)
	l := &Lifecycle{
		opts:   opts,
		leases: NewReplicaLeases(opts.Kube, opts.LeaseNamespace, opts.Clock, log),
		// The heartbeat has a writer of its own so that a burst of status
		// writes never delays a renewal.
		heartbeat: newReplicaHeartbeat(opts.Kube.CoordinationV1(), opts.LeaseNamespace, opts.Replica,
			opts.ReplicaLeaseDuration, opts.ReplicaRenewInterval, opts.Clock, log, write.New(write.Options{})),
		leadCh: make(chan context.Context),
		ready:  make(chan struct{}),
	}
	l.sweeper = &sweeper{
		client: opts.Client, reader: opts.APIReader, cache: opts.Cache, leases: l.leases,
		grace: opts.GracePeriod, neverConnectedAfter: opts.NeverConnectedAfter, resync: opts.ResyncPeriod, workers: opts.Workers,
		removals: rate.NewLimiter(rate.Limit(opts.RemovalQPS), opts.RemovalBurst),
		writer:   writes, recorder: opts.Recorder, metrics: opts.Metrics, now: opts.Clock,
		log: log.With("component", "sweeper"), leaseGrace: opts.ReplicaLeaseDuration,
	}
	l.drift = &driftReconciler{
		now: opts.Clock, client: opts.Client, reader: opts.APIReader, cache: opts.Cache, writer: writes,
		metrics: opts.Metrics, resync: opts.ResyncPeriod, workers: opts.Workers,
		log: log.With("component", "drift"),
	}
	l.entries = &entryReconciler{
		client: opts.Client, reader: opts.APIReader, cache: opts.Cache, writer: writes,
		recorder: opts.Recorder, limit: rate.NewLimiter(rate.Limit(opts.RecreateQPS), 10),
		metrics: opts.Metrics, resync: opts.ResyncPeriod, workers: opts.Workers, now: opts.Clock,
		log: log.With("component", "entries"),
	}
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Name: SweeperLeaseName, Namespace: opts.LeaseNamespace},
			Client:     opts.Kube.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: opts.Replica},
		},
		LeaseDuration:   opts.Election.LeaseDuration,
		RenewDeadline:   opts.Election.RenewDeadline,
		RetryPeriod:     opts.Election.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            SweeperLeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				select {
				case l.leadCh <- ctx:
				case <-ctx.Done():
				}
			},
			OnStoppedLeading: func() {},
			OnNewLeader: func(identity string) {
				log.Info("sweeper leader elected", "leader", identity)
			},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("registry: sweeper election: %w", err)
	}
	l.elector = elector
	return l, nil
}

// Replicas answers whether endpoint replicas are alive (valid once Start
// has begun).
func (l *Lifecycle) Replicas() *ReplicaLeases { return l.leases }

// Ready is closed once this replica's Lease exists. Serve ADS streams only
// after it: a connection recorded for a replica without a Lease is taken for
// the connection of a gone replica.
func (l *Lifecycle) Ready() <-chan struct{} { return l.ready }

// IsLeader reports whether this replica currently sweeps.
func (l *Lifecycle) IsLeader() bool { return l.elector.IsLeader() }

// Start runs the lifecycle until ctx ends: it creates this replica's Lease
// (an error here, e.g. missing RBAC, is returned at once), renews it, and
// campaigns for the sweeper Lease, sweeping and reconciling drift while it
// holds it. When ctx ends it stops its work, hands the sweeper Lease over and
// deletes the replica Lease, then returns nil. Call it once.
func (l *Lifecycle) Start(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop := func() {
		cancel()
		wg.Wait()
	}
	leasesErr := make(chan error, 1)
	wg.Go(func() { leasesErr <- l.leases.Run(ctx) })
	if !l.leases.WaitForSync(ctx) {
		stop()
		if err := <-leasesErr; err != nil {
			return err
		}
		return nil // ctx ended
	}
	if err := l.heartbeat.renew(ctx); err != nil {
		stop()
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	close(l.ready)
	wg.Go(func() { l.heartbeat.run(ctx) })

	for ctx.Err() == nil {
		electionDone := make(chan struct{})
		go func() {
			defer close(electionDone)
			l.elector.Run(ctx)
		}()
		select {
		case leadCtx := <-l.leadCh:
			l.lead(leadCtx)
			<-electionDone
		case <-electionDone:
		}
	}
	stop()
	l.heartbeat.release(ctx)
	return nil
}

// lead sweeps and reconciles drift until leadership (leadCtx) ends; it
// returns once both have stopped, so a new campaign never overlaps them.
func (l *Lifecycle) lead(ctx context.Context) {
	log := l.sweeper.log
	log.Info("leading: sweeping expired registrations", "gracePeriod", l.opts.GracePeriod, "removalQPS", l.opts.RemovalQPS, "removalBurst", l.opts.RemovalBurst)
	l.opts.Metrics.setLeader(true)
	defer l.opts.Metrics.setLeader(false)
	var wg sync.WaitGroup
	wg.Go(func() { runWhileLeading(ctx, l.sweeper.run, log) })
	wg.Go(func() { runWhileLeading(ctx, l.drift.run, l.drift.log) })
	wg.Go(func() { runWhileLeading(ctx, l.entries.run, l.entries.log) })
	for _, fn := range l.opts.Leading {
		wg.Go(func() { runWhileLeading(ctx, fn, log) })
	}
	wg.Wait()
	log.Info("stopped leading")
}

// runWhileLeading runs fn until ctx ends, starting it again (after 5s) when
// it fails, so that a leader never holds the Lease without doing its work.
func runWhileLeading(ctx context.Context, fn func(context.Context) error, log *slog.Logger) {
	for ctx.Err() == nil {
		err := fn(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		log.Error("stopped; starting again in 5s", "error", err)
		t := time.NewTimer(5 * time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

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
func decide(war *runtimev1alpha1.WorkloadAutoRegistration, now time.Time, grace time.Duration, replicas func(string) ReplicaState) decision {
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
			return decision{verdict: verdictMarkGone, why: fmt.Sprintf("endpoint replica %s holding the connection is gone (it has no Lease %s)", conn.Replica, ReplicaLeaseName(conn.Replica))}
		case !st.Alive:
			return decision{verdict: verdictMarkGone, why: fmt.Sprintf("endpoint replica %s holding the connection is gone (its Lease %s expired at %s)", conn.Replica, ReplicaLeaseName(conn.Replica), st.Expiry.UTC().Format(time.RFC3339))}
		case !st.heldSince(conn.ConnectedAt):
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
	leases   *ReplicaLeases
	grace    time.Duration
	resync   time.Duration
	workers  int
	removals *rate.Limiter
	writer   *write.Writer
	recorder record.EventRecorder
	metrics  *LifecycleMetrics
	log      *slog.Logger
	now      func() time.Time

	// neverConnectedAfter: see LifecycleOptions.NeverConnectedAfter.
	neverConnectedAfter time.Duration
	// leaseGrace is how long after this sweeper started leading an expired
	// replica Lease is not yet taken as proof that its replica is gone
	// (LifecycleOptions.ReplicaLeaseDuration). leadingSince is set by run.
	leaseGrace   time.Duration
	leadingSince time.Time

	queue workqueue.TypedRateLimitingInterface[types.NamespacedName]
}

// run sweeps until ctx ends.
func (s *sweeper) run(ctx context.Context) error {
	// A leader starting now may have been cut off from the API server (an
	// outage also ends the previous leader's term), and while nobody
	// could reach it nobody could renew a Lease either: an expired Lease
	// proves its replica gone only once the replica had a full Lease
	// duration, counted from now, to renew it (see replicaState).
	s.leadingSince = s.now()
	s.queue = workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](100*time.Millisecond, time.Minute))
	defer s.queue.ShutDown()

	inf, err := s.cache.GetInformer(ctx, &runtimev1alpha1.WorkloadAutoRegistration{})
	if err != nil {
		return fmt.Errorf("watch WorkloadAutoRegistrations: %w", err)
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { enqueueObject(s.queue, obj) },
		UpdateFunc: func(_, obj any) { enqueueObject(s.queue, obj) },
	})
	if err != nil {
		return fmt.Errorf("watch WorkloadAutoRegistrations: %w", err)
	}
	defer func() { _ = inf.RemoveEventHandler(reg) }()
	removeGone := s.leases.OnGone(func(replica string) { s.enqueueReplica(ctx, replica) })
	defer removeGone()
	if !toolscache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return nil // ctx ended
	}

	var wg sync.WaitGroup
	for range s.workers {
		wg.Go(func() {
			for registry.ProcessNext(ctx, s.queue, s.process, s.log, "sweep") {
			}
		})
	}
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
	resyncAll(ctx, s.cache, s.queue, s.resync, s.log)
	s.queue.ShutDown()
	wg.Wait()
	return nil
}

// enqueueReplica queues the registrations connected to a replica that went away.
func (s *sweeper) enqueueReplica(ctx context.Context, replica string) {
	list := &runtimev1alpha1.WorkloadAutoRegistrationList{}
	if err := s.cache.List(ctx, list); err != nil {
		s.log.Error("list registrations of a gone replica", "gone", replica, "error", err)
		return
	}
	for i := range list.Items {
		if c := list.Items[i].Status.Connection; c != nil && c.Replica == replica {
			s.queue.Add(client.ObjectKeyFromObject(&list.Items[i]))
		}
	}
}

func (s *sweeper) decide(war *runtimev1alpha1.WorkloadAutoRegistration) decision {
	return decide(war, s.now(), s.grace, func(r string) ReplicaState { return s.replicaState(s.leases.Lookup(r)) })
}

// replicaState is st as the sweeper judges it: a Lease that expired before
// this sweeper had led for leaseGrace counts as alive until then. Its
// replica could not renew it while the API server was unreachable (the
// outage that also cost the previous leader its term), so after an outage
// every replica gets a full Lease duration to renew before its workloads
// are marked disconnected. A missing Lease (deleted on clean shutdown) is
// not affected.
func (s *sweeper) replicaState(st ReplicaState) ReplicaState {
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
	var replica string
	if cached.Status.Connection != nil {
		replica = cached.Status.Connection.Replica
	}
	live, err := s.leases.LookupLive(ctx, replica)
	if err != nil {
		return err
	}
	lookup := func(r string) ReplicaState {
		if r == replica {
			return s.replicaState(live)
		}
		return s.replicaState(s.leases.Lookup(r))
	}
	var why string
	written, err := registry.UpdateRegistrationStatus(ctx, s.writer, s.client, s.reader, cached, func(cur *runtimev1alpha1.WorkloadAutoRegistration) bool {
		if cur.Status.Connection != nil && cur.Status.Connection.Replica != replica {
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

// enqueueObject queues the key of an informer object.
func enqueueObject(queue workqueue.TypedInterface[types.NamespacedName], obj any) {
	if o, ok := obj.(client.Object); ok {
		queue.Add(client.ObjectKeyFromObject(o))
	}
}

// resyncAll queues every registration now and every period until ctx ends.
func resyncAll(ctx context.Context, c cache.Cache, queue workqueue.TypedInterface[types.NamespacedName], period time.Duration, log *slog.Logger) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		list := &runtimev1alpha1.WorkloadAutoRegistrationList{}
		if err := c.List(ctx, list); err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Error("list registrations for a resync", "error", err)
		}
		for i := range list.Items {
			queue.Add(client.ObjectKeyFromObject(&list.Items[i]))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// LifecycleMetrics are the lifecycle's Prometheus metrics. A nil
// *LifecycleMetrics records nothing.
type LifecycleMetrics struct {
	removals    *prometheus.CounterVec
	replicaLost prometheus.Counter
	leader      prometheus.Gauge
	drift       *prometheus.CounterVec
	recreations prometheus.Counter
}

// NewLifecycleMetrics creates the metrics and registers them with reg.
func NewLifecycleMetrics(reg prometheus.Registerer) (*LifecycleMetrics, error) {
	m := &LifecycleMetrics{
		removals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "embark", Subsystem: "registry", Name: "grace_period_removals_total",
			Help: "Registrations removed (with their WorkloadEntry) after their workload had no ADS stream for the grace period, by cause: disconnected, never_connected, replica_gone.",
		}, []string{"cause"}),
		replicaLost: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "embark", Subsystem: "registry", Name: "replica_gone_disconnects_total",
			Help: "Registrations marked disconnected because the endpoint replica holding their stream was gone.",
		}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "embark", Subsystem: "registry", Name: "sweeper_leader",
			Help: "1 while this replica is the elected sweeper, else 0.",
		}),
		drift: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "embark", Subsystem: "registry", Name: "workloadgroup_out_of_date_writes_total",
			Help: "Writes of the WorkloadGroupOutOfDate condition, by the status written.",
		}, []string{"status"}),
		recreations: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "embark", Subsystem: "registry", Name: "workloadentry_recreations_total",
			Help: "WorkloadEntries created again after someone else deleted them while their registration lived.",
		}),
	}
	for _, c := range []prometheus.Collector{m.removals, m.replicaLost, m.leader, m.drift, m.recreations} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register lifecycle metrics: %w", err)
		}
	}
	return m, nil
}

func (m *LifecycleMetrics) removed(cause string) {
	if m != nil {
		m.removals.WithLabelValues(cause).Inc()
	}
}

func (m *LifecycleMetrics) replicaGone() {
	if m != nil {
		m.replicaLost.Inc()
	}
}

func (m *LifecycleMetrics) setLeader(leading bool) {
	if m == nil {
		return
	}
	if leading {
		m.leader.Set(1)
	} else {
		m.leader.Set(0)
	}
}

func (m *LifecycleMetrics) recreated() {
	if m != nil {
		m.recreations.Inc()
	}
}

func (m *LifecycleMetrics) driftWritten(status metav1.ConditionStatus) {
	if m != nil {
		m.drift.WithLabelValues(string(status)).Inc()
	}
}
