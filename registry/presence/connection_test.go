package presence

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/lifecycle"
	"github.com/embark-mesh/embark/test/fixtures"
)

func newConnections(t *testing.T, ctx context.Context, replica string, clock func() time.Time) *Connections {
	t.Helper()
	c, err := NewConnections(ctx, ConnectionOptions{Client: env.Client, Replica: replica, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// connState is what the registration and its WorkloadEntry say.
type observed struct {
	status         metav1.ConditionStatus
	reason         string
	replica        string
	disconnected   bool
	weController   string
	weDisconnected bool
}

func observe(t *testing.T, key types.NamespacedName) observed {
	t.Helper()
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), key, war); err != nil {
		t.Fatal(err)
	}
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(t.Context(), key, we); err != nil {
		t.Fatal(err)
	}
	var o observed
	if c := meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected); c != nil {
		o.status, o.reason = c.Status, c.Reason
	}
	if conn := war.Status.Connection; conn != nil {
		o.replica, o.disconnected = conn.Replica, conn.DisconnectedAt != nil
	}
	o.weController = we.Annotations[registry.AnnotationConnectedReplica]
	o.weDisconnected = we.Annotations[registry.AnnotationDisconnectedAt] != ""
	return o
}

func waitObserved(t *testing.T, key types.NamespacedName, want observed) {
	t.Helper()
	var got observed
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		got = observe(t, key)
		return got == want, nil
	})
	if err != nil {
		t.Fatalf("state = %+v, want %+v", got, want)
	}
}

var (
	connectedTo = func(r string) observed {
		return observed{status: metav1.ConditionTrue, reason: runtimev1alpha1.ReasonAgentEstablishedConnection, replica: r, weController: r}
	}
	disconnectedFrom = func(r string) observed {
		// A disconnect writes the registration only: the entry keeps the
		// connection's annotations and never gets a disconnected-at.
		return observed{status: metav1.ConditionFalse, reason: runtimev1alpha1.ReasonAgentDisconnected, replica: r, disconnected: true, weController: r}
	}
)

func registerForConnections(t *testing.T) (registry.StreamWorkload, *registry.Result) {
	t.Helper()
	return registerNthForConnections(t, 0)
}

// registerNthForConnections registers workload n (0-255) of its own
// namespace, with an instance ID and address of its own.
func registerNthForConnections(t *testing.T, n int) (registry.StreamWorkload, *registry.Result) {
	t.Helper()
	ns := env.Namespace(t)
	wg := fixtures.SeedGroup(ns)
	fixtures.CreateGroup(t.Context(), t, env.Client, wg)
	id, ip := "i-1234567890abcdef0", "172.31.5.254"
	if n > 0 {
		id, ip = fmt.Sprintf("i-00000000000000%03d", n), fmt.Sprintf("172.31.6.%d", n)
	}
	res, err := newRegistrar(t, nil).Write(t.Context(), registry.Request{Group: wg, Identity: fixtures.AWSIdentity(id), Registration: fixtures.Registration(ip)})
	if err != nil {
		t.Fatal(err)
	}
	return registry.StreamWorkload{Key: client.ObjectKeyFromObject(res.Registration), UID: res.Registration.UID, Group: wg.Name}, res
}

func TestConnectDisconnectReconnect(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, _ := registerForConnections(t)
	c := newConnections(t, ctx, "replica-a", nil)

	// Two streams of one workload count once.
	c.Opened(w, 1)
	c.Opened(w, 2)
	waitObserved(t, w.Key, connectedTo("replica-a"))
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, w.Key, war); err != nil {
		t.Fatal(err)
	}
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(ctx, w.Key, we); err != nil {
		t.Fatal(err)
	}
	if war.Status.Connection.ConnectedAt == nil || we.Annotations[registry.AnnotationConnectedAt] == "" {
		t.Errorf("connectedAt: status %v, annotation %q", war.Status.Connection.ConnectedAt, we.Annotations[registry.AnnotationConnectedAt])
	}
	c.Closed(w, 1)
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := observe(t, w.Key); got != connectedTo("replica-a") {
		t.Errorf("after one of two streams closed: %+v", got)
	}
	rv := war.ResourceVersion
	if err := env.Client.Get(ctx, w.Key, war); err != nil || war.ResourceVersion != rv {
		t.Errorf("status rewritten without a change: rv %s -> %s (%v)", rv, war.ResourceVersion, err)
	}

	c.Closed(w, 2)
	waitObserved(t, w.Key, disconnectedFrom("replica-a"))

	c.Opened(w, 3)
	waitObserved(t, w.Key, connectedTo("replica-a"))
	c.Closed(w, 3)
	waitObserved(t, w.Key, disconnectedFrom("replica-a"))
	cancel()
	c.Wait()
}

func TestStaleDisconnectDoesNotOverwriteANewerConnect(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, _ := registerForConnections(t)
	a := newConnections(t, ctx, "replica-a", nil)
	b := newConnections(t, ctx, "replica-b", func() time.Time { return time.Now().Add(2 * time.Second) })

	a.Opened(w, 1)
	waitObserved(t, w.Key, connectedTo("replica-a"))
	// The sidecar moved to replica B before A noticed its stream was gone.
	b.Opened(w, 1)
	waitObserved(t, w.Key, connectedTo("replica-b"))
	a.Closed(w, 1)
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := observe(t, w.Key); got != connectedTo("replica-b") {
		t.Errorf("replica A's stale disconnect overwrote B's connection: %+v", got)
	}
	b.Closed(w, 1)
	waitObserved(t, w.Key, disconnectedFrom("replica-b"))
	cancel()
	a.Wait()
	b.Wait()
}

func TestEventsOfADeletedRegistrationAreDropped(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, res := registerForConnections(t)
	c := newConnections(t, ctx, "replica-a", nil)
	if err := env.Client.Delete(ctx, res.Registration); err != nil {
		t.Fatal(err)
	}
	fixtures.Eventually(t, 30*time.Second, "registration deleted", func() bool {
		return apierrors.IsNotFound(env.Client.Get(ctx, w.Key, &runtimev1alpha1.WorkloadAutoRegistration{}))
	})
	c.Opened(w, 1)
	c.Closed(w, 1)
	flushCtx, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	if err := c.Flush(flushCtx); err != nil {
		t.Fatalf("writes for a deleted registration kept retrying: %v", err)
	}
	cancel()
	c.Wait()
}

// A replica holding live streams writes the workload connected again when
// the stored status lost it (the sweeper marked it ReplicaGone after this
// replica's Lease lapsed), driven by its own watch of registrations, and does
// nothing for workloads it holds no stream of.
func TestReassertRestoresALiveConnection(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, _ := registerForConnections(t)
	c := newConnections(t, ctx, "replica-a", nil)
	informers, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{w.Key.Namespace: {}}})
	if err != nil {
		t.Fatal(err)
	}
	var bg sync.WaitGroup
	defer bg.Wait()
	defer cancel()
	bg.Go(func() { _ = informers.Start(ctx) })
	if !informers.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	watchErr := make(chan error, 1)
	bg.Go(func() { watchErr <- c.Watch(ctx, informers) })
	c.Opened(w, 1)
	waitObserved(t, w.Key, connectedTo("replica-a"))

	markGone := func() *runtimev1alpha1.WorkloadAutoRegistration {
		t.Helper()
		war := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := env.Client.Get(ctx, w.Key, war); err != nil {
			t.Fatal(err)
		}
		meta.SetStatusCondition(&war.Status.Conditions, metav1.Condition{Type: runtimev1alpha1.ConditionAgentConnected, Status: metav1.ConditionFalse, Reason: lifecycle.ReasonReplicaGone})
		now := metav1.Now()
		war.Status.Connection.DisconnectedAt = &now
		if err := env.Client.Status().Update(ctx, war); err != nil {
			t.Fatal(err)
		}
		return war
	}
	markGone() // the watch sees the update and reasserts
	waitObserved(t, w.Key, connectedTo("replica-a"))

	// No stream here any more: a lost connection is not reasserted.
	c.Closed(w, 1)
	waitObserved(t, w.Key, disconnectedFrom("replica-a"))
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, w.Key, war); err != nil {
		t.Fatal(err)
	}
	war.Status.Connection.Replica = "replica-b"
	meta.SetStatusCondition(&war.Status.Conditions, metav1.Condition{Type: runtimev1alpha1.ConditionAgentConnected, Status: metav1.ConditionTrue, Reason: runtimev1alpha1.ReasonAgentEstablishedConnection})
	if err := env.Client.Status().Update(ctx, war); err != nil {
		t.Fatal(err)
	}
	c.Reassert(war)
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	after := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, w.Key, after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != war.ResourceVersion {
		t.Errorf("a replica without streams rewrote the status: %+v", after.Status)
	}
	cancel()
	c.Wait()
	bg.Wait()
	if err := <-watchErr; err != nil {
		t.Errorf("Watch() = %v", err)
	}
}

// A workload that moved to replica B while its stream to replica A is still
// open is B's: A's watch sees B's connection and leaves it (reasserting it
// would flip the holder back to A, and A's disconnect a moment later would
// store the live workload disconnected).
func TestReassertLeavesAnotherReplicasConnection(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, _ := registerForConnections(t)
	a := newConnections(t, ctx, "replica-a", nil)
	b := newConnections(t, ctx, "replica-b", nil)
	a.Opened(w, 1)
	waitObserved(t, w.Key, connectedTo("replica-a"))
	b.Opened(w, 1)
	waitObserved(t, w.Key, connectedTo("replica-b"))

	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, w.Key, war); err != nil {
		t.Fatal(err)
	}
	a.Reassert(war) // what A's watch does on B's write
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	a.Closed(w, 1)
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	after := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, w.Key, after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != war.ResourceVersion {
		t.Errorf("replica A rewrote B's connection: %+v", after.Status)
	}
	cancel()
	a.Wait()
	b.Wait()
}

// countingClient counts the calls a tracker makes to the API server, by
// kind: "status" (registration status writes), "entry" (WorkloadEntry
// writes) and "get" (reads).
type countingClient struct {
	client.Client
	mu     sync.Mutex
	writes map[string]int
}

func newCountingClient() *countingClient {
	cc := &countingClient{writes: map[string]int{}}
	cc.Client = interceptor.NewClient(env.Client, interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			cc.count("entry")
			return c.Update(ctx, obj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			cc.count(sub)
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			cc.count("get")
			return c.Get(ctx, key, obj, opts...)
		},
	})
	return cc
}

func (cc *countingClient) count(kind string) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.writes[kind]++
}

func (cc *countingClient) take() map[string]int {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	w := cc.writes
	cc.writes = map[string]int{}
	return w
}

// uids returns the UIDs of the registration and its WorkloadEntry, to tell
// a re-creation.
func uids(t *testing.T, key types.NamespacedName) [2]types.UID {
	t.Helper()
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(t.Context(), key, war); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(t.Context(), key, we); err != nil {
		t.Fatal(err)
	}
	return [2]types.UID{war.UID, we.UID}
}

// writes returns the write counts of cc's counts (reads left out).
func writes(got map[string]int) map[string]int {
	delete(got, "get")
	return got
}

// With a Cache in sync, a state costs its writes only: the read before each
// write comes from the cache (a mass disconnect is one API call per
// workload).
func TestCachedReadSavesTheAPIRead(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, _ := registerForConnections(t)
	cc := newCountingClient()
	c, err := NewConnections(ctx, ConnectionOptions{Client: cc, Cache: cached, Replica: "replica-a", DisconnectDelay: -1})
	if err != nil {
		t.Fatal(err)
	}
	c.Opened(w, 1)
	waitObserved(t, w.Key, connectedTo("replica-a"))
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	fixtures.Eventually(t, 30*time.Second, "the cache shows the connection", func() bool {
		war := &runtimev1alpha1.WorkloadAutoRegistration{}
		return cached.Get(ctx, w.Key, war) == nil && war.Status.Connection != nil && war.Status.Connection.Replica == "replica-a"
	})
	cc.take()
	c.Closed(w, 1)
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := cc.take(); got["status"] != 1 || got["get"] != 0 || got["entry"] != 0 {
		t.Errorf("a disconnect with the cache in sync made %v API calls, want one status write and no read", got)
	}
	waitObserved(t, w.Key, disconnectedFrom("replica-a"))
	cancel()
	c.Wait()
}

// staleReader serves the copies of objects taken when it was made: an
// informer cache lagging behind the API server (a real one lags for
// moments only, too briefly to test deterministically).
type staleReader struct {
	client.Reader
	war *runtimev1alpha1.WorkloadAutoRegistration
	we  *istionetworkingv1.WorkloadEntry
}

func (r staleReader) Get(_ context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	switch o := obj.(type) {
	case *runtimev1alpha1.WorkloadAutoRegistration:
		r.war.DeepCopyInto(o)
	case *istionetworkingv1.WorkloadEntry:
		r.we.DeepCopyInto(o)
	}
	return nil
}

// A lagging cache never makes a state wrong: a cached copy that leads to
// no write is read again from the API server (the disconnect is stored),
// and a cached copy's write conflicts and is retried from the API server.
func TestStaleCacheStillStoresTheTruth(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, res := registerForConnections(t)
	stale := staleReader{war: res.Registration.DeepCopy(), we: res.WorkloadEntry.DeepCopy()}
	if err := env.Client.Get(ctx, w.Key, stale.war); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, w.Key, stale.we); err != nil {
		t.Fatal(err)
	}
	cc := newCountingClient()
	c, err := NewConnections(ctx, ConnectionOptions{Client: cc, Cache: stale, Replica: "replica-a", DisconnectDelay: -1})
	if err != nil {
		t.Fatal(err)
	}
	c.Opened(w, 1) // the copies are current: written at once
	waitObserved(t, w.Key, connectedTo("replica-a"))
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := writes(cc.take()); got["status"] != 1 || got["entry"] != 1 {
		t.Errorf("connect wrote %v, want one status and one entry write", got)
	}
	// The cached copy shows no connection: nothing to disconnect, so the
	// registration is read again and the disconnect is stored.
	c.Closed(w, 1)
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	waitObserved(t, w.Key, disconnectedFrom("replica-a"))
	if got := cc.take(); got["status"] != 1 || got["get"] != 1 {
		t.Errorf("disconnect from a stale copy made %v API calls, want one read and one status write", got)
	}
	// The cached copy's resourceVersion is old: its write conflicts and the
	// retry reads from the API server.
	c.Opened(w, 2)
	waitObserved(t, w.Key, connectedTo("replica-a"))
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// (The entry's second write is needed only when the reconnect is in
	// another second than the first connect: its annotation is to the
	// second.)
	if got := writes(cc.take()); got["status"] != 2 || got["entry"] < 1 || got["entry"] > 2 {
		t.Errorf("reconnect from stale copies wrote %v, want a conflict and a write of the status, a conflict and at most a write of the entry", got)
	}
	cancel()
	c.Wait()
}

// A reconnect within the disconnect delay drops the held disconnect: the
// blip writes nothing, and a later disconnect is still written.
func TestReconnectDropsAHeldDisconnect(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, _ := registerForConnections(t)
	cc := newCountingClient()
	c, err := NewConnections(ctx, ConnectionOptions{Client: cc, Replica: "replica-a", DisconnectDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c.Opened(w, 1)
	waitObserved(t, w.Key, connectedTo("replica-a"))
	if got := cc.take(); got["status"] != 1 || got["entry"] != 1 {
		t.Fatalf("connect wrote %v, want one status and one entry write", got)
	}
	c.Closed(w, 1)
	c.Opened(w, 2) // within the (hour-long) delay
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := writes(cc.take()); len(got) != 0 {
		t.Errorf("a reconnect within the delay wrote %v", got)
	}
	if got := observe(t, w.Key); got != connectedTo("replica-a") {
		t.Errorf("after the blip: %+v", got)
	}
	// Flush writes a held disconnect at once.
	c.Closed(w, 2)
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := observe(t, w.Key); got != disconnectedFrom("replica-a") {
		t.Errorf("after flushing a held disconnect: %+v", got)
	}
	cancel()
	c.Wait()
}

// A workload's disconnect is held for DisconnectDelay, then written without
// anyone flushing it.
func TestHeldDisconnectIsWrittenAfterTheDelay(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, _ := registerForConnections(t)
	c, err := NewConnections(ctx, ConnectionOptions{Client: env.Client, Replica: "replica-a", DisconnectDelay: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c.Opened(w, 1)
	waitObserved(t, w.Key, connectedTo("replica-a"))
	c.Closed(w, 1)
	waitObserved(t, w.Key, disconnectedFrom("replica-a"))
	cancel()
	c.Wait()
}

// A replica shutting down while another runs hands its workloads over
// (HandOver): its closing streams write no disconnect, even when Flush
// waits, so a workload whose sidecar reconnects to the other replica gets no
// AgentConnected transition however long that replica takes to store it,
// and one that reconnects nowhere keeps the stored connection for the
// sweeper to mark gone when the Lease of the replica expires.
func TestHandOverWritesNoDisconnect(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	moving, _ := registerNthForConnections(t, 1)
	leaving, _ := registerNthForConnections(t, 2)
	cc := newCountingClient()
	a, err := NewConnections(ctx, ConnectionOptions{Client: cc, Replica: "replica-a"})
	if err != nil {
		t.Fatal(err)
	}
	b := newConnections(t, ctx, "replica-b", func() time.Time { return time.Now().Add(2 * time.Second) })
	a.Opened(moving, 1)
	a.Opened(leaving, 2)
	waitObserved(t, moving.Key, connectedTo("replica-a"))
	waitObserved(t, leaving.Key, connectedTo("replica-a"))
	since := connectedSince(t, moving.Key)
	cc.take()

	// Replica A shuts down and flushes; the moving sidecar reconnects to
	// replica B only afterwards.
	a.HandOver()
	a.Drain()
	a.Closed(moving, 1)
	a.Closed(leaving, 2)
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := writes(cc.take()); len(got) != 0 {
		t.Errorf("the handing-over replica wrote %v at shutdown, want nothing", got)
	}
	b.Opened(moving, 1)
	waitObserved(t, moving.Key, connectedTo("replica-b"))
	if got := connectedSince(t, moving.Key); !got.Equal(&since) {
		t.Errorf("AgentConnected of the moved workload changed at %v (connected since %v): a transition was written", got, since)
	}
	if got := observe(t, leaving.Key); got != connectedTo("replica-a") {
		t.Errorf("the workload that reconnected nowhere: %+v, want still connected to replica-a (for the sweeper)", got)
	}
	cancel()
	a.Wait()
	b.Wait()
}

// connectedSince returns the last transition time of the registration's
// AgentConnected condition.
func connectedSince(t *testing.T, key types.NamespacedName) metav1.Time {
	t.Helper()
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), key, war); err != nil {
		t.Fatal(err)
	}
	c := meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected)
	if c == nil {
		t.Fatalf("%s has no AgentConnected condition", key)
	}
	return c.LastTransitionTime
}

// A reconnect storm: every stream of a replica breaks and the sidecars
// reconnect, to the same replica (a blip, or the replica's process
// restarted) or to another replica (takeover). Each costs at most one write
// per object and workload, and nothing is re-created.
func TestReconnectStormWritesAtMostOncePerWorkload(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const n = 5
	var ws []registry.StreamWorkload
	for i := range n {
		w, _ := registerNthForConnections(t, i+1)
		ws = append(ws, w)
	}
	before := map[types.NamespacedName][2]types.UID{}
	cc := newCountingClient()
	first, err := NewConnections(ctx, ConnectionOptions{Client: cc, Replica: "replica-a"})
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range ws {
		first.Opened(w, int64(i))
		before[w.Key] = uids(t, w.Key)
	}
	for _, w := range ws {
		waitObserved(t, w.Key, connectedTo("replica-a"))
	}

	steps := []struct {
		name      string
		replica   string
		restarted bool // a new process (tracker) of the replica
		maxWrites int
	}{
		{"blip on the same process", "replica-a", false, 0},
		{"the replica's process restarted", "replica-a", true, 1},
		{"takeover by another replica", "replica-b", true, 1},
	}
	cur := first
	for _, s := range steps {
		cc.take()
		next := cur
		if s.restarted {
			cc = newCountingClient()
			// The old process dies without writing anything.
			cancel()
			cur.Wait()
			ctx, cancel = context.WithCancel(t.Context())
			// The new process starts in a later second than the stored
			// connections (timestamps have one-second precision).
			later := func() time.Time { return time.Now().Add(2 * time.Second) }
			if next, err = NewConnections(ctx, ConnectionOptions{Client: cc, Replica: s.replica, Clock: later}); err != nil {
				t.Fatal(err)
			}
		}
		for i, w := range ws {
			if !s.restarted {
				next.Closed(w, int64(i))
			}
			next.Opened(w, int64(i+100))
		}
		if err := next.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		for _, w := range ws {
			if got := observe(t, w.Key); got != connectedTo(s.replica) {
				t.Errorf("%s: %s is %+v", s.name, w.Key, got)
			}
			if got := uids(t, w.Key); got != before[w.Key] {
				t.Errorf("%s: %s was re-created", s.name, w.Key)
			}
		}
		got := cc.take()
		if got["status"] > s.maxWrites*n || got["entry"] > s.maxWrites*n {
			t.Errorf("%s: %v writes for %d workloads, want at most %d each", s.name, got, n, s.maxWrites*n)
		}
		if s.maxWrites > 0 && (got["status"] != n || got["entry"] != n) {
			t.Errorf("%s: %v writes for %d workloads, want exactly one of each per workload", s.name, got, n)
		}
		cur = next
	}
	cancel()
	cur.Wait()
}

// A disconnect costs one write, the registration's status (which holds the
// disconnect time); the WorkloadEntry is not written.
func TestDisconnectWritesTheRegistrationOnly(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, _ := registerForConnections(t)
	cc := newCountingClient()
	c, err := NewConnections(ctx, ConnectionOptions{Client: cc, Replica: "replica-a"})
	if err != nil {
		t.Fatal(err)
	}
	c.Opened(w, 1)
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	cc.take()
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(ctx, w.Key, we); err != nil {
		t.Fatal(err)
	}
	c.Closed(w, 1)
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := cc.take(); got["status"] != 1 || got["entry"] != 0 {
		t.Errorf("a disconnect wrote %v, want one status write and no entry write", got)
	}
	if got := observe(t, w.Key); got != disconnectedFrom("replica-a") {
		t.Errorf("after the disconnect: %+v", got)
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, w.Key, war); err != nil {
		t.Fatal(err)
	}
	if war.Status.Connection.DisconnectedAt == nil {
		t.Errorf("status.connection.disconnectedAt not stored: %+v", war.Status.Connection)
	}
	after := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(ctx, w.Key, after); err != nil || after.ResourceVersion != we.ResourceVersion {
		t.Errorf("the disconnect rewrote the WorkloadEntry: %v (%v)", after.Annotations, err)
	}
	cancel()
	c.Wait()
}

// An entry written by an earlier version carries a disconnected-at (and
// maybe istiod's annotations, or an istio.io/rev label that hides it from
// other revisions' istiods): the next connect removes them, and a reconnect
// after a stored disconnect moves connected-at to the new connection.
func TestConnectRewritesTheEntrysConnectionAnnotations(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, _ := registerForConnections(t)
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(ctx, w.Key, we); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour).UTC()
	if we.Annotations == nil {
		we.Annotations = map[string]string{}
	}
	we.Annotations[registry.AnnotationConnectedReplica] = "replica-a"
	we.Annotations[registry.AnnotationConnectedAt] = old.Format(time.RFC3339Nano)
	we.Annotations[registry.AnnotationDisconnectedAt] = old.Add(time.Minute).Format(time.RFC3339Nano)
	we.Annotations["istio.io/disconnectedAt"] = old.Add(time.Minute).Format(time.RFC3339Nano)
	if we.Labels == nil {
		we.Labels = map[string]string{}
	}
	if we.Spec.Labels == nil {
		we.Spec.Labels = map[string]string{}
	}
	we.Labels[registry.LabelRevision], we.Spec.Labels[registry.LabelRevision] = "canary", "canary"
	if err := env.Client.Update(ctx, we); err != nil {
		t.Fatal(err)
	}
	var offset atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	c := newConnections(t, ctx, "replica-a", clock)
	annotations := func() map[string]string {
		t.Helper()
		if err := c.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		got := &istionetworkingv1.WorkloadEntry{}
		if err := env.Client.Get(ctx, w.Key, got); err != nil {
			t.Fatal(err)
		}
		return got.Annotations
	}
	c.Opened(w, 1)
	first := clock()
	ann := annotations()
	for _, k := range []string{registry.AnnotationDisconnectedAt, "istio.io/disconnectedAt"} {
		if _, ok := ann[k]; ok {
			t.Errorf("connect kept %s: %v", k, ann)
		}
	}
	if err := env.Client.Get(ctx, w.Key, we); err != nil {
		t.Fatal(err)
	}
	if _, ok := we.Labels[registry.LabelRevision]; ok {
		t.Errorf("connect kept the entry's istio.io/rev label: %v", we.Labels)
	}
	if _, ok := we.Spec.Labels[registry.LabelRevision]; ok {
		t.Errorf("connect kept the endpoint's istio.io/rev label: %v", we.Spec.Labels)
	}
	at, err := time.Parse(time.RFC3339Nano, ann[registry.AnnotationConnectedAt])
	if err != nil || at.Before(first.Add(-time.Second)) || ann[registry.AnnotationConnectedReplica] != "replica-a" {
		t.Fatalf("after connect: %v (%v)", ann, err)
	}

	c.Closed(w, 1)
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	offset.Store(int64(5 * time.Second))
	c.Opened(w, 2)
	ann = annotations()
	again, err := time.Parse(time.RFC3339Nano, ann[registry.AnnotationConnectedAt])
	if err != nil || again.Sub(at) < 4*time.Second {
		t.Errorf("reconnect after a stored disconnect: connected-at %q, was %s (%v)", ann[registry.AnnotationConnectedAt], at, err)
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, w.Key, war); err != nil {
		t.Fatal(err)
	}
	if conn := war.Status.Connection; conn == nil || conn.ConnectedAt == nil || !conn.ConnectedAt.Time.Equal(again.Truncate(time.Second)) {
		t.Errorf("registration's connectedAt %v, entry's %s", conn, again)
	}
	cancel()
	c.Wait()
}
