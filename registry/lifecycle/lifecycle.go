package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/replica"
	"github.com/embark-mesh/embark/registry/write"
)

// SweeperLeaseName is the Lease that elects the replica that sweeps.
const SweeperLeaseName = "embark-sweeper"

// Defaults of Options.
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

// errNoReplica is returned for a Lifecycle without a replica name.
var errNoReplica = errors.New("registry: the replica name is required")

// Options configures a Lifecycle. Every field documents its default.
type Options struct {
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
	// RemovalQPS bounds the steady rate of removals (token bucket): of
	// expired registrations, and of the credential Secrets and
	// WorkloadEntries whose registration is gone, together. Default: 20.
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
	Metrics *Metrics
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
type ElectionTiming = replica.ElectionTiming

func (o *Options) setDefaults() error {
	if o.Client == nil || o.Cache == nil || o.Kube == nil {
		return errors.New("registry: Options.Client, Cache and Kube are required")
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
		o.ReplicaLeaseDuration = replica.DefaultLeaseDuration
	}
	if o.ReplicaRenewInterval <= 0 {
		o.ReplicaRenewInterval = replica.DefaultRenewInterval
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
		o.Recorder = registry.NoEvents{}
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
// WorkloadGroupOutOfDate condition, creates again a WorkloadEntry deleted
// while its registration lives, and removes the credential Secrets and
// WorkloadEntries whose registration is gone.
type Lifecycle struct {
	opts      Options
	leases    *replica.Leases
	heartbeat *replica.Heartbeat
	sweeper   *sweeper
	drift     *driftReconciler
	entries   *entryReconciler
	orphans   []*orphanCollector
	election  *replica.Election
	ready     chan struct{}
	// keepLease: HandOver found another replica alive; Start leaves this
	// replica's Lease to expire instead of releasing it.
	keepLease atomic.Bool
}

// NewLifecycle returns a Lifecycle; Start runs it.
func NewLifecycle(opts Options) (*Lifecycle, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	log := opts.Logger.With("replica", opts.Replica)
	writes := write.OrDefault(opts.Writer)
	// The heartbeat has a writer of its own (its default) so that a burst of
	// status writes never delays a renewal.
	heartbeat, err := replica.NewHeartbeat(replica.HeartbeatOptions{
		Leases: opts.Kube.CoordinationV1(), Namespace: opts.LeaseNamespace, Replica: opts.Replica,
		Duration: opts.ReplicaLeaseDuration, Interval: opts.ReplicaRenewInterval, Clock: opts.Clock, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	l := &Lifecycle{
		opts:      opts,
		leases:    replica.NewLeases(opts.Kube, opts.LeaseNamespace, opts.Clock, log),
		heartbeat: heartbeat,
		ready:     make(chan struct{}),
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
	for _, kind := range []dependentKind{sidecarCredentials, workloadEntries} {
		l.orphans = append(l.orphans, &orphanCollector{
			kind: kind, client: opts.Client, reader: opts.APIReader, cache: opts.Cache, writer: writes,
			removals: l.sweeper.removals, metrics: opts.Metrics, resync: opts.ResyncPeriod, workers: opts.Workers,
			now: opts.Clock, minAge: orphanMinAge, log: log.With("component", "orphans", "kind", kind.name),
		})
	}
	election, err := replica.NewElection(opts.Kube, opts.LeaseNamespace, SweeperLeaseName, opts.Replica, opts.Election, log)
	if err != nil {
		return nil, fmt.Errorf("registry: sweeper election: %w", err)
	}
	l.election = election
	return l, nil
}

// Replicas answers whether endpoint replicas are alive (valid once Start
// has begun).
func (l *Lifecycle) Replicas() *replica.Leases { return l.leases }

// Ready is closed once this replica's Lease exists. Serve ADS streams only
// after it: a connection recorded for a replica without a Lease is taken for
// the connection of a gone replica.
func (l *Lifecycle) Ready() <-chan struct{} { return l.ready }

// IsLeader reports whether this replica currently sweeps.
func (l *Lifecycle) IsLeader() bool { return l.election.IsLeader() }

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
	if err := l.heartbeat.Renew(ctx); err != nil {
		stop()
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	close(l.ready)
	wg.Go(func() { l.heartbeat.Run(ctx) })
	l.election.Run(ctx, l.lead)
	stop()
	if l.keepLease.Load() {
		l.sweeper.log.Info("replica Lease left to expire: the other replicas take this replica's workloads over")
		return nil
	}
	l.heartbeat.Release(ctx)
	return nil
}

// HandOver is called as the replica shuts down, before its streams close:
// when another replica is alive, it reports true and Start will leave this
// replica's Lease to expire (ReplicaLeaseDuration) instead of releasing it,
// so that the sweeper takes this replica's connections for gone only then:
// the sidecars reconnect to the other replicas meanwhile, and those store
// their connections over this replica's without an AgentConnected
// transition. With no other replica alive it reports false, and the Lease is
// released as usual.
func (l *Lifecycle) HandOver() bool {
	if !l.leases.OthersAlive(l.opts.Replica) {
		return false
	}
	l.keepLease.Store(true)
	return true
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
	for _, o := range l.orphans {
		wg.Go(func() { runWhileLeading(ctx, o.run, o.log) })
	}
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
