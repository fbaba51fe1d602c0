package presence

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/write"
)

// ConnectionOptions configures Connections. Every field documents its default.
type ConnectionOptions struct {
	// Client writes registrations and WorkloadEntries, and reads them fresh
	// from the API server (not from a cache) whenever Cache's copy cannot be
	// used. Required.
	Client client.Client
	// Cache, when set, saves the read before a write: a write's first
	// attempt reads the object from it (an informer cache holding whole
	// registrations and WorkloadEntries: no Transform), and only when that
	// copy leads to no write (it may lag) or its write conflicts is the
	// object read again from Client. A mass disconnect then costs one API
	// call per workload, not two. Default: every attempt reads from Client.
	Cache client.Reader
	// Replica is this endpoint replica's name, written as the connection's
	// owner. Required.
	Replica string
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// Writer is the replica's write budget, shared with every component
	// that writes (write.Writer). Default: a Writer of its own with
	// write.Options' defaults.
	Writer *write.Writer
	// Retry is the backoff between attempts of a state that could not be
	// stored (its writes ran out of retries); a state is retried until it is
	// stored, superseded by a newer one, or the tracker stops. Default: 100ms
	// doubling, capped at 1s (DefaultStateRetry): the cap bounds how long
	// after an API server outage the states it held back are stored (the
	// write budget, not the retries, bounds the load on the API server).
	Retry wait.Backoff
	// DisconnectDelay holds a workload's disconnect back this long before
	// it is written: a stream of the workload opening again within it drops
	// the disconnect, so a brief reconnect writes nothing. The recorded
	// disconnect time stays the instant the last stream closed. Flush writes
	// held disconnects at once. Zero means the default; negative, no delay.
	// Default 1s.
	DisconnectDelay time.Duration
	// OutOfTrafficAfter takes a workload out of traffic when its last
	// stream on this replica closed this long ago and it has not connected
	// again (to any replica): one write to its WorkloadEntry (traffic.go,
	// docs/lifecycle.md), undone by its next connect. The timer starts
	// once the disconnect is stored; a draining replica (Drain) starts
	// none. Zero means the default; negative, never. Default
	// DefaultOutOfTrafficAfter (10s).
	OutOfTrafficAfter time.Duration
	// Metrics. Default: not recorded.
	Metrics *ConnectionMetrics
	// Clock. Default time.Now.
	Clock func() time.Time
}

// Connections tracks which workloads hold ADS streams to this replica and
// writes the connection state to their WorkloadAutoRegistration (condition
// AgentConnected, status.connection) and, on connect, to their WorkloadEntry
// (annotations onboarding.tetrate.io/connected-at and /connected-replica;
// istiod's own istio.io/ annotations and the /disconnected-at of earlier
// versions are removed). A disconnect costs one write, the registration's
// status, which holds the disconnect time (status.connection.disconnectedAt).
//
// Opened and Closed never block on the API server: each workload has a queue
// of one pending state that a newer event replaces (coalescing), written by a
// goroutine of its own with optimistic concurrency until stored (latest). Several
// streams of one workload count once. Only the replica holding the stream
// writes; a disconnect never overwrites a newer connection by another replica.
//
// Writes are avoided where the stored state already tells the truth: a
// disconnect is held back for DisconnectDelay and dropped when the workload
// reconnects in the meantime, and a connection is written only when the
// stored status does not already show the workload connected to this replica
// since this tracker started (so a reconnect storm costs at most one write
// per object and workload, none after a blip).
type Connections struct {
	ctx     context.Context
	client  client.Client
	cache   client.Reader // nil: none
	replica string
	log     *slog.Logger
	writer  *write.Writer
	retry   wait.Backoff
	metrics *ConnectionMetrics
	now     func() time.Time
	delay   time.Duration
	// outAfter is OutOfTrafficAfter (<= 0: never).
	outAfter time.Duration
	// started is when this tracker started; a stored connection of this
	// replica from before it belongs to an earlier process of the replica.
	started time.Time

	streamIDs atomic.Int64 // NewStreamID's last ID

	mu       sync.Mutex
	entries  map[types.NamespacedName]*connEntry
	queue    *latest[*connEntry, connState] // guarded by mu
	flushing int                            // Flush calls waiting: held disconnects are written at once
	// idle are called (without mu) when a workload's last stream on this
	// replica closes, so that per-workload state elsewhere is dropped.
	idle []func(registry.StreamWorkload)
	// outTimers are the pending out-of-traffic timers, one per workload
	// whose disconnect this replica stored less than outAfter ago; a
	// connect or Drain cancels them.
	outTimers map[types.NamespacedName]*outTimer
	// draining: the replica shuts down; no out-of-traffic timer starts.
	draining bool
	// handingOver: the replica shuts down while another runs (HandOver);
	// streams closing write no disconnect.
	handingOver bool
}

// connEntry is one workload's streams on this replica and its pending state.
type connEntry struct {
	workload    registry.StreamWorkload
	streams     []int64   // open streams' IDs (a workload has one or a few)
	connectedAt time.Time // when the current (or last) connection began
	slot        slot[connState]
}

// connState is a connection state to store.
type connState struct {
	workload       registry.StreamWorkload
	connected      bool
	connectedAt    time.Time
	disconnectedAt time.Time
	// holdUntil (real time) is when a held disconnect may be written.
	holdUntil time.Time
	// closed (real time) is when the last stream closed; the
	// out-of-traffic delay runs from it.
	closed time.Time
	// outOfTraffic: take the workload out of traffic (the disconnect is
	// stored already).
	outOfTraffic bool
}

// NewConnections returns a tracker whose writes run until ctx ends.
func NewConnections(ctx context.Context, opts ConnectionOptions) (*Connections, error) {
	if opts.Client == nil || opts.Replica == "" {
		return nil, errors.New("registry: Client and Replica are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Retry.Steps <= 0 {
		opts.Retry = DefaultStateRetry
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	switch {
	case opts.DisconnectDelay == 0:
		opts.DisconnectDelay = DefaultDisconnectDelay
	case opts.DisconnectDelay < 0:
		opts.DisconnectDelay = 0
	}
	if opts.OutOfTrafficAfter == 0 {
		opts.OutOfTrafficAfter = DefaultOutOfTrafficAfter
	}
	c := &Connections{
		ctx: ctx, client: opts.Client, cache: opts.Cache, replica: opts.Replica, log: opts.Logger,
		writer: write.OrDefault(opts.Writer), retry: opts.Retry, metrics: opts.Metrics, now: opts.Clock,
		delay: opts.DisconnectDelay, outAfter: opts.OutOfTrafficAfter, started: opts.Clock(),
		entries: map[types.NamespacedName]*connEntry{}, outTimers: map[types.NamespacedName]*outTimer{},
	}
	c.queue = &latest[*connEntry, connState]{ctx: ctx, mu: &c.mu, retry: opts.Retry, store: c.store, retrying: c.retrying, ended: c.ended}
	return c, nil
}

// DefaultStateRetry is ConnectionOptions.Retry's default.
var DefaultStateRetry = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: time.Second}

// DefaultDisconnectDelay is ConnectionOptions.DisconnectDelay's default.
const DefaultDisconnectDelay = time.Second

// Replica returns the name this tracker writes as the connection's owner.
func (c *Connections) Replica() string { return c.replica }

// NewStreamID returns a stream ID no other call returned: callers with
// several numberings of their own (go-control-plane counts SotW and Delta
// streams apart, both from 1) take their Opened and Closed IDs from it, so
// two streams never share one.
func (c *Connections) NewStreamID() int64 { return c.streamIDs.Add(1) }

// Opened records that stream streamID of workload w is open. The first
// stream of a workload marks it connected. streamID must name no other open
// stream of this tracker (see NewStreamID); an ID already open for w is
// ignored.
func (c *Connections) Opened(w registry.StreamWorkload, streamID int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancelOutOfTrafficLocked(w.Key)
	e := c.entries[w.Key]
	if e == nil || (e.workload.UID != w.UID && len(e.streams) == 0) {
		if e != nil && e.slot.running {
			// The old registration's state is still being written: keep
			// the entry (its writer drains it) but start afresh.
			e.workload = w
		} else {
			e = &connEntry{workload: w, slot: newSlot[connState]()}
			c.entries[w.Key] = e
		}
	}
	if slices.Contains(e.streams, streamID) {
		return
	}
	e.streams = append(e.streams, streamID)
	if len(e.streams) > 1 {
		return
	}
	e.workload = w
	e.connectedAt = c.now()
	c.metrics.opened(w)
	c.enqueueLocked(e, &connState{workload: w, connected: true, connectedAt: e.connectedAt})
}

// Closed records that stream streamID of workload w closed. When it was the
// workload's last stream on this replica, the workload is marked
// disconnected.
func (c *Connections) Closed(w registry.StreamWorkload, streamID int64) {
	c.mu.Lock()
	e := c.entries[w.Key]
	if e == nil {
		c.mu.Unlock()
		return
	}
	i := slices.Index(e.streams, streamID)
	if i < 0 {
		c.mu.Unlock()
		return
	}
	e.streams = slices.Delete(e.streams, i, i+1)
	if len(e.streams) > 0 {
		c.mu.Unlock()
		return
	}
	now, closed := c.now(), time.Now()
	c.metrics.closed(e.workload)
	if c.handingOver {
		// The workload reconnects to another replica, which stores it;
		// one that does not is marked gone when this replica's Lease
		// expires.
		c.ended(e)
		idle, workload := c.idle, e.workload
		c.mu.Unlock()
		for _, f := range idle {
			f(workload)
		}
		return
	}
	c.enqueueLocked(e, &connState{workload: e.workload, connected: false, connectedAt: e.connectedAt, disconnectedAt: now,
		holdUntil: closed.Add(c.delay), closed: closed})
	idle, workload := c.idle, e.workload
	c.mu.Unlock()
	for _, f := range idle {
		f(workload)
	}
}

// onIdle registers f to be called when a workload's last stream on this
// replica closes.
func (c *Connections) onIdle(f func(registry.StreamWorkload)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.idle = append(c.idle, f)
}

// Reassert writes the workload connected again when this replica holds
// streams for war but war's stored status says it is not connected at all
// (another component, e.g. the sweeper after this replica's Lease lapsed,
// marked it disconnected while its streams stayed open). A connection stored
// by another replica is left alone. The stored state then follows
// the truth instead of letting a connected workload be removed.
func (c *Connections) Reassert(war *runtimev1alpha1.WorkloadAutoRegistration) {
	key := types.NamespacedName{Namespace: war.Namespace, Name: war.Name}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[key]
	if e == nil || len(e.streams) == 0 || e.workload.UID != war.UID || e.slot.pending != nil || war.DeletionTimestamp != nil {
		return
	}
	conn := war.Status.Connection
	if meta.IsStatusConditionTrue(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected) && conn != nil && conn.DisconnectedAt == nil {
		// Stored connected: to this replica, or to another one the sidecar
		// moved to while its stream here is still open (a takeover). That
		// one's connection stands; reasserting ours would flip the holder
		// back, and our disconnect a moment later would store a live
		// workload disconnected. When the other replica's stream closes
		// and it stores the disconnect, this watch reasserts then.
		return
	}
	c.log.Info("reasserting a live connection the stored status lost", "registration", key.String())
	e.connectedAt = c.now()
	c.enqueueLocked(e, &connState{workload: e.workload, connected: true, connectedAt: e.connectedAt})
}

// Watch keeps the stored connection state true to this replica's streams
// until ctx ends: on every add (including the replay when the watch
// begins) and update of a registration in informers it calls Reassert, so
// a status another component marked disconnected (the sweeper, after this
// replica's Lease lapsed) while the streams stayed open is written
// connected again. The endpoint runs it beside the xDS server, which only
// reports stream opens and closes.
func (c *Connections) Watch(ctx context.Context, informers cache.Informers) error {
	inf, err := informers.GetInformer(ctx, &runtimev1alpha1.WorkloadAutoRegistration{})
	if err != nil {
		return fmt.Errorf("watch WorkloadAutoRegistrations: %w", err)
	}
	reassert := func(obj any) {
		if war, ok := obj.(*runtimev1alpha1.WorkloadAutoRegistration); ok {
			c.Reassert(war)
		}
	}
	// Adds too: the informer replays what it holds when the handler is
	// added, so a status marked disconnected before the watch began (the
	// informer may still be syncing when streams open) is reasserted as
	// well; level-based, not edge-based.
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    reassert,
		UpdateFunc: func(_, obj any) { reassert(obj) },
	})
	if err != nil {
		return fmt.Errorf("watch WorkloadAutoRegistrations: %w", err)
	}
	defer func() { _ = inf.RemoveEventHandler(reg) }()
	<-ctx.Done()
	return nil
}

// Streams returns how many streams of the workload are open on this replica.
func (c *Connections) Streams(key types.NamespacedName) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[key]; e != nil {
		return len(e.streams)
	}
	return 0
}

// Flush writes held disconnects at once and waits until every pending state
// is stored (or dropped), or ctx ends.
func (c *Connections) Flush(ctx context.Context) error {
	c.mu.Lock()
	c.flushing++
	for _, e := range c.entries {
		e.slot.signal()
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.flushing--
		c.mu.Unlock()
	}()
	return write.WaitIdle(ctx, "connection states", c.queue.busy)
}

// Wait waits for every writer goroutine to end and stops the pending
// out-of-traffic timers; call it after the tracker's context ended.
func (c *Connections) Wait() {
	c.Drain()
	c.queue.wait()
}

// enqueueLocked replaces e's pending state and starts its writer (a held
// disconnect replaced by a connect is dropped unwritten).
func (c *Connections) enqueueLocked(e *connEntry, st *connState) {
	c.queue.putLocked(e, &e.slot, st)
}

// ended forgets e when its writer ended and no stream of it is open (mu
// held).
func (c *Connections) ended(e *connEntry) {
	if len(e.streams) == 0 && c.entries[e.workload.Key] == e {
		delete(c.entries, e.workload.Key)
	}
}

// retrying logs a state whose store failed and is retried.
func (c *Connections) retrying(_ *connEntry, st *connState, err error, in time.Duration) {
	c.log.Error("store connection state; retrying", "registration", st.workload.Key.String(), "connected", st.connected, "retryIn", in, "error", err)
}

var errRegistrationReplaced = errors.New("registration replaced by a newer one of the same name")

// store stores one state (the latest queue's store): a disconnect is held
// for DisconnectDelay unless Flush waits or the tracker stops, then written
// to the registration only, and starts the out-of-traffic timer; a
// connection is written to the registration, then to its WorkloadEntry
// (which puts an entry taken out of traffic back); an out-of-traffic
// decision is at most one write to the WorkloadEntry (traffic.go). A
// registration gone or replaced drops the state.
func (c *Connections) store(_ *connEntry, st *connState) (time.Duration, error) {
	if st.outOfTraffic {
		err := c.storeOutOfTraffic(st)
		if err != nil && (apierrors.IsNotFound(err) || errors.Is(err, errRegistrationReplaced)) {
			return 0, nil // gone: nothing to take out
		}
		return 0, err
	}
	if !st.connected {
		c.mu.Lock()
		flushing := c.flushing > 0
		c.mu.Unlock()
		if hold := time.Until(st.holdUntil); hold > 0 && !flushing && c.ctx.Err() == nil {
			return hold, nil // a reconnect replaces it
		}
	}
	shown, err := c.storeRegistration(st)
	if err == nil && st.connected && shown != nil {
		err = c.storeWorkloadEntry(st, shown)
	}
	switch {
	case err == nil:
		if !st.connected && shown != nil {
			c.metrics.statusWritten(c.now().Sub(st.disconnectedAt))
			c.startOutOfTraffic(st)
		}
		return 0, nil
	case apierrors.IsNotFound(err) || errors.Is(err, errRegistrationReplaced):
		c.log.Debug("connection state not stored: registration gone", "registration", st.workload.Key.String(), "error", err)
		return 0, nil
	default:
		return 0, err
	}
}

// storeRegistration writes the AgentConnected condition and status.connection.
// It returns the registration's status.connection when the registration
// shows st afterwards, nil when it does not (another replica's newer
// connection, or a disconnect already stored).
func (c *Connections) storeRegistration(st *connState) (*runtimev1alpha1.ConnectionStatus, error) {
	var shown *runtimev1alpha1.ConnectionStatus
	// modify decides from cur whether to write, and changes cur to what is
	// written; shown is what the registration shows afterwards.
	modify := func(cur *runtimev1alpha1.WorkloadAutoRegistration) (bool, error) {
		shown = nil
		if st.workload.UID != "" && cur.UID != st.workload.UID {
			return false, errRegistrationReplaced
		}
		conn := cur.Status.Connection
		connectedAt := metav1.NewTime(st.connectedAt.Truncate(time.Second))
		if st.connected {
			if conn != nil && conn.Replica != c.replica && conn.DisconnectedAt == nil && conn.ConnectedAt != nil && conn.ConnectedAt.After(connectedAt.Time) {
				return false, nil // a newer connection held by another replica
			}
			if c.showsOurConnection(cur) {
				shown = conn
				return false, nil // already true: a reconnect writes nothing
			}
			conn = &runtimev1alpha1.ConnectionStatus{Replica: c.replica, ConnectedAt: &connectedAt}
		} else {
			if conn == nil || conn.Replica != c.replica || conn.DisconnectedAt != nil ||
				(conn.ConnectedAt != nil && conn.ConnectedAt.After(connectedAt.Time)) {
				// Not ours (another replica connected since), or already
				// marked disconnected: never overwrite it.
				return false, nil
			}
			conn = conn.DeepCopy()
			disconnectedAt := metav1.NewTime(st.disconnectedAt)
			conn.DisconnectedAt = &disconnectedAt
		}
		cond := c.condition(st, cur.Generation)
		changed := meta.SetStatusCondition(&cur.Status.Conditions, cond)
		if !equalConnection(cur.Status.Connection, conn) {
			cur.Status.Connection = conn
			changed = true
		}
		shown = conn
		return changed, nil
	}
	attempt := 0
	err := c.writer.Do(c.ctx, func(ctx context.Context) error {
		attempt++
		return readModifyWrite(ctx, c, st.workload.Key, attempt == 1, &runtimev1alpha1.WorkloadAutoRegistration{}, modify,
			func(ctx context.Context, cur *runtimev1alpha1.WorkloadAutoRegistration) error {
				return c.client.Status().Update(ctx, cur)
			})
	})
	if err != nil {
		return nil, fmt.Errorf("write connection state of %s: %w", st.workload.Key, err)
	}
	return shown, nil
}

// readModifyWrite is one attempt of a write of the object key: modify
// decides from the object read whether to write it (and changes it), write
// writes it. On a write's first attempt (cached) with a Cache, the object is
// read from the cache, which saves the API read when it leads to a write; a
// stale copy's write fails with a conflict (the Writer retries, reading from
// the API server). Any other outcome of the cached copy (nothing to write,
// gone, replaced, an error) may be the cache lagging, so the object is read
// again from the API server and modify decides again: the cache never
// decides anything but to write.
func readModifyWrite[T client.Object](ctx context.Context, c *Connections, key types.NamespacedName, cached bool, obj T,
	modify func(T) (bool, error), write func(context.Context, T) error) error {
	if cached && c.cache != nil {
		fromCache := obj.DeepCopyObject().(T)
		if err := c.cache.Get(ctx, key, fromCache); err == nil {
			if ok, err := modify(fromCache); err == nil && ok {
				return write(ctx, fromCache)
			}
		}
	}
	if err := c.client.Get(ctx, key, obj); err != nil {
		return err
	}
	ok, err := modify(obj)
	if err != nil || !ok {
		return err
	}
	return write(ctx, obj)
}

// showsOurConnection reports whether war's stored status says the workload is
// connected to this replica, by a connection made since this tracker started
// (an older one is an earlier process's, which the sweeper would take for
// gone, so it must be written anew).
func (c *Connections) showsOurConnection(war *runtimev1alpha1.WorkloadAutoRegistration) bool {
	conn := war.Status.Connection
	return meta.IsStatusConditionTrue(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected) &&
		conn != nil && conn.Replica == c.replica && conn.DisconnectedAt == nil && conn.ConnectedAt != nil &&
		!conn.ConnectedAt.Time.Before(c.started.Truncate(time.Second))
}

func (c *Connections) condition(st *connState, generation int64) metav1.Condition {
	if st.connected {
		return metav1.Condition{
			Type: runtimev1alpha1.ConditionAgentConnected, Status: metav1.ConditionTrue,
			Reason:  runtimev1alpha1.ReasonAgentEstablishedConnection,
			Message: "the sidecar holds an ADS stream to replica " + c.replica,
			// SetStatusCondition keeps the old time when the status does not change.
			LastTransitionTime: metav1.NewTime(st.connectedAt), ObservedGeneration: generation,
		}
	}
	return metav1.Condition{
		Type: runtimev1alpha1.ConditionAgentConnected, Status: metav1.ConditionFalse,
		Reason:             runtimev1alpha1.ReasonAgentDisconnected,
		Message:            "the sidecar's last ADS stream to replica " + c.replica + " closed",
		LastTransitionTime: metav1.NewTime(st.disconnectedAt), ObservedGeneration: generation,
	}
}

func equalConnection(a, b *runtimev1alpha1.ConnectionStatus) bool {
	if a == nil || b == nil {
		return a == b
	}
	eq := func(x, y *metav1.Time) bool {
		if x == nil || y == nil {
			return x == y
		}
		return x.Equal(y)
	}
	return a.Replica == b.Replica && eq(a.ConnectedAt, b.ConnectedAt) && eq(a.DisconnectedAt, b.DisconnectedAt)
}

// storeWorkloadEntry writes the connection annotations of the registration's
// WorkloadEntry to match shown, the registration's status.connection after
// st (a connection) was stored: connected-at and connected-replica; a
// disconnected-at of earlier versions and istiod's own annotations are
// removed, and so is an istio.io/rev label earlier versions wrote (it hides
// the entry from the istiods of other revisions; see registry.LabelRevision). A missing entry (fenced, or not written yet) is skipped. A
// disconnect writes no entry: the registration's status holds its time.
func (c *Connections) storeWorkloadEntry(st *connState, shown *runtimev1alpha1.ConnectionStatus) error {
	// The connection's start as the annotation shows it: st's own instant
	// when the registration shows st's connection (it stores it to the
	// second), else the start of the connection it shows (a reconnect
	// within the disconnect delay keeps the connection it continues).
	since := st.connectedAt
	if shown.ConnectedAt != nil && !shown.ConnectedAt.Time.Equal(st.connectedAt.Truncate(time.Second)) {
		since = shown.ConnectedAt.Time
	}
	// modify decides from we whether to write it, and changes it.
	modify := func(we *istionetworkingv1.WorkloadEntry) (bool, error) {
		if ref, ok := registry.OwnedBy(we.OwnerReferences, st.workload.Key.Name); !ok || (st.workload.UID != "" && ref.UID != st.workload.UID) {
			return false, nil
		}
		ann := we.Annotations
		holder := ann[registry.AnnotationConnectedReplica]
		heldSince, _ := time.Parse(time.RFC3339Nano, ann[registry.AnnotationConnectedAt])
		if holder != "" && holder != c.replica && heldSince.After(since) {
			return false, nil // a newer connection held by another replica
		}
		want := registry.WithoutIstiodAnnotations(ann)
		if want == nil {
			want = map[string]string{}
		}
		delete(want, registry.AnnotationDisconnectedAt)
		backInTraffic(want)
		if holder != c.replica || !heldSince.Truncate(time.Second).Equal(since.Truncate(time.Second)) {
			want[registry.AnnotationConnectedAt] = since.UTC().Format(time.RFC3339Nano)
			want[registry.AnnotationConnectedReplica] = c.replica
		}
		_, labelled := we.Labels[registry.LabelRevision]
		_, specLabelled := we.Spec.Labels[registry.LabelRevision]
		if equalStrings(ann, want) && !labelled && !specLabelled { // (an entry with istiod's annotations always differs)
			return false, nil
		}
		we.Annotations = want
		delete(we.Labels, registry.LabelRevision)
		delete(we.Spec.Labels, registry.LabelRevision)
		return true, nil
	}
	attempt := 0
	err := c.writer.Do(c.ctx, func(ctx context.Context) error {
		attempt++
		err := readModifyWrite(ctx, c, st.workload.Key, attempt == 1, &istionetworkingv1.WorkloadEntry{}, modify,
			func(ctx context.Context, we *istionetworkingv1.WorkloadEntry) error { return c.client.Update(ctx, we) })
		return client.IgnoreNotFound(err)
	})
	if err != nil {
		return fmt.Errorf("write connection annotations of WorkloadEntry %s: %w", st.workload.Key, err)
	}
	return nil
}

func equalStrings(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// ConnectionMetrics are the connection tracker's metrics.
type ConnectionMetrics struct {
	mu sync.Mutex
	// held counts the workloads connected per group; a group's series are
	// deleted when it drops to zero, so deleted groups leave no series.
	held             map[groupKey]int
	counterRetention time.Duration
	connected        *prometheus.GaugeVec
	connects         *prometheus.CounterVec
	disconnects      *prometheus.CounterVec
	latency          prometheus.Histogram
	outOfTraffic     prometheus.Counter
}

type groupKey struct{ namespace, group string }

// NewConnectionMetrics registers the connection metrics with reg:
// embark_xds_connected_workloads{workload_namespace,group},
// embark_xds_connects_total{workload_namespace,group},
// embark_xds_disconnects_total{workload_namespace,group} (a group's gauge
// is deleted when its last workload disconnects from this replica, its
// counters 15 minutes later if none connected since: a deleted group
// leaves no series) and
// embark_registry_disconnect_status_write_seconds (from a workload's last
// stream closing to its registration showing it) and
// embark_registry_out_of_traffic_total (WorkloadEntries taken out of
// traffic because their sidecar did not reconnect in time).
func NewConnectionMetrics(reg prometheus.Registerer) (*ConnectionMetrics, error) {
	labels := []string{WorkloadNamespaceLabel, "group"}
	m := &ConnectionMetrics{
		held:             map[groupKey]int{},
		counterRetention: 15 * time.Minute,
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "embark_xds_connected_workloads",
			Help: "Workloads whose sidecar holds at least one ADS stream to this replica.",
		}, labels),
		connects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "embark_xds_connects_total",
			Help: "Workloads that went from no stream to one stream on this replica.",
		}, labels),
		disconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "embark_xds_disconnects_total",
			Help: "Workloads whose last stream on this replica closed.",
		}, labels),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "embark_registry_disconnect_status_write_seconds",
			Help:    "Time from a workload's last stream closing to its registration's status saying so.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
		outOfTraffic: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "embark_registry_out_of_traffic_total",
			Help: "WorkloadEntries this replica took out of traffic because their sidecar's last stream here closed and did not come back within registration.outOfTrafficAfter.",
		}),
	}
	for _, col := range []prometheus.Collector{m.connected, m.connects, m.disconnects, m.latency, m.outOfTraffic} {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("register connection metrics: %w", err)
		}
	}
	return m, nil
}

func (m *ConnectionMetrics) opened(w registry.StreamWorkload) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.held[groupKey{w.Key.Namespace, w.Group}]++
	m.connected.WithLabelValues(w.Key.Namespace, w.Group).Inc()
	m.connects.WithLabelValues(w.Key.Namespace, w.Group).Inc()
}

func (m *ConnectionMetrics) closed(w registry.StreamWorkload) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k := groupKey{w.Key.Namespace, w.Group}
	m.disconnects.WithLabelValues(k.namespace, k.group).Inc()
	if m.held[k]--; m.held[k] > 0 {
		m.connected.WithLabelValues(k.namespace, k.group).Dec()
		return
	}
	// The group's last workload on this replica: its gauge goes now, its
	// counters when the group stays empty for counterRetention (long
	// enough for rate() to see the last increments).
	delete(m.held, k)
	m.connected.DeleteLabelValues(k.namespace, k.group)
	time.AfterFunc(m.counterRetention, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.held[k] == 0 {
			m.connects.DeleteLabelValues(k.namespace, k.group)
			m.disconnects.DeleteLabelValues(k.namespace, k.group)
		}
	})
}

func (m *ConnectionMetrics) statusWritten(d time.Duration) {
	if m == nil {
		return
	}
	m.latency.Observe(d.Seconds())
}

func (m *ConnectionMetrics) tookOutOfTraffic() {
	if m == nil {
		return
	}
	m.outOfTraffic.Inc()
}
