package lifecycle

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/replica"
	"github.com/embark-mesh/embark/test/fixtures"
)

// lifecycleHarness is one running Lifecycle (one endpoint replica).
type lifecycleHarness struct {
	lc      *Lifecycle
	metrics *Metrics
	reg     *prometheus.Registry
	cache   cache.Cache
	cancel  context.CancelFunc
	// cacheDone is closed when the cache stopped.
	cacheDone chan struct{}
	done      chan error
	stopped   sync.Once
}

// startLifecycle starts a Lifecycle for replica, watching leaseNamespace only, with test-sized timings
// (grace period 2s, replica Lease 2s, election Lease 2s) that mutate may
// change; it is stopped when the test ends.
func startLifecycle(t *testing.T, leaseNamespace, replica string, mutate func(*Options)) *lifecycleHarness {
	t.Helper()
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	metrics, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	// A cache of its own, of the test's namespace only, so that the
	// sweeper never touches (or counts) registrations of other tests.
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	informers, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{leaseNamespace: {}}})
	if err != nil {
		t.Fatal(err)
	}
	cacheDone := make(chan struct{})
	go func() {
		defer close(cacheDone)
		_ = informers.Start(ctx)
	}()
	if !informers.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	opts := Options{
		Client: env.Client, Cache: informers, Kube: kube,
		Replica: replica, LeaseNamespace: leaseNamespace,
		GracePeriod:          2 * time.Second,
		ResyncPeriod:         10 * time.Second,
		ReplicaLeaseDuration: 2 * time.Second,
		ReplicaRenewInterval: 300 * time.Millisecond,
		Election:             ElectionTiming{LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond},
		Recorder:             recorder,
		Metrics:              metrics,
		Logger:               fixtures.Logger(t).With("test-replica", replica),
	}
	if mutate != nil {
		mutate(&opts)
	}
	lc, err := NewLifecycle(opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	h := &lifecycleHarness{lc: lc, metrics: metrics, reg: reg, cache: informers, cancel: cancel, done: make(chan error, 1), cacheDone: cacheDone}
	go func() { h.done <- lc.Start(ctx) }()
	t.Cleanup(func() { h.stop(t) })
	return h
}

// stop stops the Lifecycle and waits for it.
func (h *lifecycleHarness) stop(t *testing.T) {
	t.Helper()
	h.stopped.Do(func() {
		h.cancel()
		select {
		case err := <-h.done:
			if err != nil {
				t.Errorf("Lifecycle.Start: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Lifecycle did not stop")
		}
		<-h.cacheDone
	})
}

// removals is the value of embark_registry_grace_period_removals_total{cause}.
func (h *lifecycleHarness) removals(t *testing.T, cause string) float64 {
	t.Helper()
	return metricValue(t, h.reg, "embark_registry_grace_period_removals_total", cause)
}

// metricValue sums a metric's samples whose label values include label ("" for all).
func metricValue(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || l.GetValue() == label
			}
			if !match {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// lifecycleGroup creates a WorkloadGroup named ratings in ns.
func lifecycleGroup(t *testing.T, ns string) *istionetworkingv1.WorkloadGroup {
	t.Helper()
	wg := &istionetworkingv1.WorkloadGroup{ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: ns}}
	wg.Spec.Template = &istioapi.WorkloadEntry{
		Labels:         map[string]string{"app": "ratings", "class": "vm"},
		ServiceAccount: "ratings-vm",
		Network:        "virtual-machines",
	}
	if err := env.Client.Create(t.Context(), wg); err != nil {
		t.Fatal(err)
	}
	return wg
}

// createRegistration writes a registration of workload n in wg and its
// WorkloadEntry as the registrar makes them (snapshot, owner references), so
// that these tests do not depend on the registrar's own checks.
func createRegistration(t *testing.T, wg *istionetworkingv1.WorkloadGroup, n int) (*runtimev1alpha1.WorkloadAutoRegistration, *istionetworkingv1.WorkloadEntry) {
	t.Helper()
	ctx := t.Context()
	snap, err := registry.Snapshot(wg)
	if err != nil {
		t.Fatal(err)
	}
	id := fixtures.AWSIdentity(fmt.Sprintf("i-%017x", n))
	war := &runtimev1alpha1.WorkloadAutoRegistration{
		ObjectMeta: metav1.ObjectMeta{
			Name: registry.RegistrationName(wg.Name, registry.IdentityName(id), 0), Namespace: wg.Namespace,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: istionetworkingv1.SchemeGroupVersion.String(), Kind: "WorkloadGroup",
				Name: wg.Name, UID: wg.UID, Controller: ptr.To(true),
			}},
		},
		Spec: runtimev1alpha1.WorkloadAutoRegistrationSpec{
			Identity:      id,
			Registration:  fixtures.Registration(fmt.Sprintf("10.%d.%d.%d", 1+n>>16&0xff, n>>8&0xff, n&0xff)),
			WorkloadGroup: snap,
		},
	}
	if err := env.Client.Create(ctx, war); err != nil {
		t.Fatal(err)
	}
	we, err := registry.BuildWorkloadEntry(war)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, we); err != nil {
		t.Fatal(err)
	}
	return war, we
}

// setConnection writes connection state as the xDS side does (the replica
// holding the stream): connected (AgentConnected=True, connectedAt=at) or
// disconnected (False, disconnectedAt=at). It returns the stored registration.
func setConnection(t *testing.T, war *runtimev1alpha1.WorkloadAutoRegistration, replica string, connected bool, at time.Time) *runtimev1alpha1.WorkloadAutoRegistration {
	t.Helper()
	cur := &runtimev1alpha1.WorkloadAutoRegistration{}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(war), cur); err != nil {
			return err
		}
		ts := metav1.NewTime(at)
		cond := metav1.Condition{Type: runtimev1alpha1.ConditionAgentConnected, ObservedGeneration: cur.Generation, LastTransitionTime: ts}
		if connected {
			cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, runtimev1alpha1.ReasonAgentEstablishedConnection, "connected to "+replica
			cur.Status.Connection = &runtimev1alpha1.ConnectionStatus{Replica: replica, ConnectedAt: &ts}
		} else {
			cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, runtimev1alpha1.ReasonAgentDisconnected, "disconnected from "+replica
			if cur.Status.Connection == nil {
				cur.Status.Connection = &runtimev1alpha1.ConnectionStatus{Replica: replica}
			}
			cur.Status.Connection.DisconnectedAt = &ts
		}
		meta.SetStatusCondition(&cur.Status.Conditions, cond)
		return env.Client.Status().Update(t.Context(), cur)
	})
	if err != nil {
		t.Fatalf("write connection state of %s: %v", war.Name, err)
	}
	return cur
}

// waitRemovedOnTime waits until obj is gone and fails when it went before
// notBefore (seen gone by a read that returned before notBefore) or more than
// slack after it.
func waitRemovedOnTime(t *testing.T, obj client.Object, notBefore time.Time, slack time.Duration) {
	t.Helper()
	var goneAt time.Time
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, time.Until(notBefore)+slack+10*time.Second, true, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object))
		if apierrors.IsNotFound(err) {
			goneAt = time.Now()
			return true, nil
		}
		return false, err
	})
	if err != nil {
		t.Fatalf("%s not removed: %v", obj.GetName(), err)
	}
	if goneAt.Before(notBefore) {
		t.Errorf("%s removed at %s or earlier, before the grace period ended at %s", obj.GetName(), goneAt.Format(time.StampMilli), notBefore.Format(time.StampMilli))
	}
	if goneAt.After(notBefore.Add(slack)) {
		t.Errorf("%s removed at %s, more than %s after the grace period ended at %s", obj.GetName(), goneAt.Format(time.StampMilli), slack, notBefore.Format(time.StampMilli))
	}
}

// onTime is how late after its grace period a removal may be seen.
const onTime = 3 * time.Second

func getRegistration(t *testing.T, war *runtimev1alpha1.WorkloadAutoRegistration) *runtimev1alpha1.WorkloadAutoRegistration {
	t.Helper()
	cur := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(war), cur); err != nil {
		t.Fatalf("registration %s: %v", war.Name, err)
	}
	return cur
}

func TestDecide(t *testing.T) {
	now := time.Date(2021, 10, 9, 10, 0, 0, 0, time.UTC)
	grace := 5 * time.Minute
	ts := func(ago time.Duration) *metav1.Time { return ptr.To(metav1.NewTime(now.Add(-ago))) }
	// Stored timestamps have one-second precision: the grace period runs
	// from the end of the stored second.
	const slack = time.Second
	connected := func(replica string, ago time.Duration) runtimev1alpha1.WorkloadAutoRegistrationStatus {
		return runtimev1alpha1.WorkloadAutoRegistrationStatus{
			Conditions: []metav1.Condition{{Type: runtimev1alpha1.ConditionAgentConnected, Status: metav1.ConditionTrue, Reason: runtimev1alpha1.ReasonAgentEstablishedConnection, LastTransitionTime: *ts(ago)}},
			Connection: &runtimev1alpha1.ConnectionStatus{Replica: replica, ConnectedAt: ts(ago)},
		}
	}
	disconnected := func(reason string, ago time.Duration) runtimev1alpha1.WorkloadAutoRegistrationStatus {
		return runtimev1alpha1.WorkloadAutoRegistrationStatus{
			Conditions: []metav1.Condition{{Type: runtimev1alpha1.ConditionAgentConnected, Status: metav1.ConditionFalse, Reason: reason, LastTransitionTime: *ts(ago)}},
			Connection: &runtimev1alpha1.ConnectionStatus{Replica: "a", ConnectedAt: ts(time.Hour), DisconnectedAt: ts(ago)},
		}
	}
	neverConnected := func(ago time.Duration) runtimev1alpha1.WorkloadAutoRegistrationStatus {
		return runtimev1alpha1.WorkloadAutoRegistrationStatus{
			Conditions: []metav1.Condition{{Type: runtimev1alpha1.ConditionAgentConnected, Status: metav1.ConditionFalse, Reason: runtimev1alpha1.ReasonAgentNeverConnected, LastTransitionTime: *ts(ago)}},
		}
	}
	replicas := map[string]replica.State{
		"alive":     {Found: true, Alive: true, Expiry: now.Add(30 * time.Second), Started: now.Add(-time.Hour)},
		"expired":   {Found: true, Expiry: now.Add(-time.Second), Started: now.Add(-time.Hour)},
		"restarted": {Found: true, Alive: true, Expiry: now.Add(30 * time.Second), Started: now.Add(-time.Minute)},
	}
	lookup := func(r string) replica.State { return replicas[r] }

	tests := []struct {
		name      string
		created   time.Duration // ago
		status    runtimev1alpha1.WorkloadAutoRegistrationStatus
		deleting  bool
		want      verdict
		wantAt    time.Time
		wantCause string
	}{
		{name: "connected to a live replica", created: time.Hour, status: connected("alive", 10*time.Minute), want: verdictKeep},
		{name: "connected to a replica with an expired Lease", created: time.Hour, status: connected("expired", 10*time.Minute), want: verdictMarkGone},
		{name: "connected to a replica without a Lease", created: time.Hour, status: connected("unknown", 10*time.Minute), want: verdictMarkGone},
		{name: "connected to a replica that restarted since", created: time.Hour, status: connected("restarted", 10*time.Minute), want: verdictMarkGone},
		{name: "connected within the second the replica started", created: time.Hour, status: connected("restarted", time.Minute), want: verdictKeep},
		{name: "connected with no replica recorded", created: time.Hour, status: connected("", time.Minute), want: verdictMarkGone},
		{name: "disconnected within the grace period", created: time.Hour, status: disconnected(runtimev1alpha1.ReasonAgentDisconnected, time.Minute), want: verdictWait, wantAt: now.Add(4*time.Minute + slack), wantCause: causeDisconnected},
		// The stored second may hide up to 1s: never early.
		{name: "disconnected the grace period ago, to the second", created: time.Hour, status: disconnected(runtimev1alpha1.ReasonAgentDisconnected, grace), want: verdictWait, wantAt: now.Add(slack), wantCause: causeDisconnected},
		{name: "disconnected the grace period and a second ago", created: time.Hour, status: disconnected(runtimev1alpha1.ReasonAgentDisconnected, grace+slack), want: verdictRemove, wantAt: now, wantCause: causeDisconnected},
		{name: "disconnected longer ago", created: time.Hour, status: disconnected(runtimev1alpha1.ReasonAgentDisconnected, 6*time.Minute), want: verdictRemove, wantAt: now.Add(-time.Minute + slack), wantCause: causeDisconnected},
		{name: "replica gone, within the grace period", created: time.Hour, status: disconnected(ReasonReplicaGone, time.Minute), want: verdictWait, wantAt: now.Add(4*time.Minute + slack), wantCause: causeReplicaGone},
		{name: "never connected, young", created: time.Minute, want: verdictWait, wantAt: now.Add(4*time.Minute + slack), wantCause: causeNeverConnected},
		{name: "never connected, old", created: time.Hour, want: verdictRemove, wantAt: now.Add(-55*time.Minute + slack), wantCause: causeNeverConnected},
		// Writing AgentNeverConnected does not extend the grace period.
		{name: "never connected condition, old", created: time.Hour, status: neverConnected(58 * time.Minute), want: verdictRemove, wantAt: now.Add(-55*time.Minute + slack), wantCause: causeNeverConnected},
		{name: "never connected condition, young", created: 2 * time.Minute, status: neverConnected(time.Minute), want: verdictWait, wantAt: now.Add(3*time.Minute + slack), wantCause: causeNeverConnected},
		{name: "being deleted", created: time.Hour, deleting: true, want: verdictKeep},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			war := &runtimev1alpha1.WorkloadAutoRegistration{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: *ts(tt.created)}, Status: tt.status}
			if tt.deleting {
				war.DeletionTimestamp = ts(0)
			}
			got := decide(war, now, grace, lookup)
			if got.verdict != tt.want {
				t.Fatalf("verdict = %d (%s), want %d", got.verdict, got.why, tt.want)
			}
			if !tt.wantAt.IsZero() && !got.at.Equal(tt.wantAt) {
				t.Errorf("grace period ends %s, want %s", got.at, tt.wantAt)
			}
			if got.cause != tt.wantCause {
				t.Errorf("cause = %q, want %q", got.cause, tt.wantCause)
			}
		})
	}
}

func TestSweeperRemovesDisconnectedAfterGracePeriodUnlessReconnected(t *testing.T) {
	ns := env.Namespace(t)
	wg := lifecycleGroup(t, ns)
	h := startLifecycle(t, ns, "replica-a", nil)
	gone, goneEntry := createRegistration(t, wg, 1)
	back, backEntry := createRegistration(t, wg, 2)
	now := time.Now()
	setConnection(t, gone, "replica-a", true, now)
	setConnection(t, back, "replica-a", true, now)

	// Both sidecars disconnect; one comes back within the grace period.
	stored := setConnection(t, gone, "replica-a", false, time.Now())
	setConnection(t, back, "replica-a", false, time.Now())
	setConnection(t, back, "replica-a", true, time.Now())

	waitRemovedOnTime(t, gone, stored.Status.Connection.DisconnectedAt.Add(2*time.Second), onTime)
	fixtures.WaitGone(t, env.Client, goneEntry)
	fixtures.WaitEvent(t, env.Client, ns, gone.Name, ReasonGracePeriodExpired, "disconnected since")
	if got := h.removals(t, causeDisconnected); got != 1 {
		t.Errorf("removals{cause=disconnected} = %v, want 1", got)
	}

	// Its grace period ended with the other one's: it is kept.
	kept := getRegistration(t, back)
	if !meta.IsStatusConditionTrue(kept.Status.Conditions, runtimev1alpha1.ConditionAgentConnected) {
		t.Errorf("reconnected registration: AgentConnected = %+v", meta.FindStatusCondition(kept.Status.Conditions, runtimev1alpha1.ConditionAgentConnected))
	}
	if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(backEntry), &istionetworkingv1.WorkloadEntry{}); err != nil {
		t.Errorf("reconnected registration's WorkloadEntry: %v", err)
	}
}

func TestSweeperRemovesNeverConnectedAfterGracePeriod(t *testing.T) {
	ns := env.Namespace(t)
	wg := lifecycleGroup(t, ns)
	h := startLifecycle(t, ns, "replica-a", nil)
	war, we := createRegistration(t, wg, 1)

	waitRemovedOnTime(t, war, war.CreationTimestamp.Add(2*time.Second), onTime)
	fixtures.WaitGone(t, env.Client, we)
	fixtures.WaitEvent(t, env.Client, ns, war.Name, ReasonGracePeriodExpired, "never connected")
	if got := h.removals(t, causeNeverConnected); got != 1 {
		t.Errorf("removals{cause=never_connected} = %v, want 1", got)
	}
}

// A reconnect written between the sweeper's last look and its delete wins:
// the delete's resourceVersion precondition fails and the live object says
// connected.
func TestReconnectRacingTheRemovalWins(t *testing.T) {
	ns := env.Namespace(t)
	wg := lifecycleGroup(t, ns)
	racer, racerEntry := createRegistration(t, wg, 1)
	control, _ := createRegistration(t, wg, 2)
	raced := make(chan error, 1)
	var once sync.Once
	racing := interceptor.NewClient(env.Client, interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if obj.GetName() != racer.Name {
				return c.Delete(ctx, obj, opts...)
			}
			first := false
			once.Do(func() { first = true })
			if !first {
				return c.Delete(ctx, obj, opts...)
			}
			// The sidecar reconnects just before the delete reaches the API server.
			cur := &runtimev1alpha1.WorkloadAutoRegistration{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(racer), cur); err != nil {
				raced <- err
				return err
			}
			now := metav1.Now()
			meta.SetStatusCondition(&cur.Status.Conditions, metav1.Condition{Type: runtimev1alpha1.ConditionAgentConnected, Status: metav1.ConditionTrue, Reason: runtimev1alpha1.ReasonAgentEstablishedConnection, LastTransitionTime: now})
			cur.Status.Connection = &runtimev1alpha1.ConnectionStatus{Replica: "replica-a", ConnectedAt: &now}
			if err := c.Status().Update(ctx, cur); err != nil {
				raced <- err
				return err
			}
			err := c.Delete(ctx, obj, opts...)
			raced <- err
			return err
		},
	})
	startLifecycle(t, ns, "replica-a", func(o *Options) { o.Client = racing; o.APIReader = env.Client })

	// Both never connected: they expire together.
	waitRemovedOnTime(t, control, control.CreationTimestamp.Add(2*time.Second), onTime)
	select {
	case err := <-raced:
		if !apierrors.IsConflict(err) {
			t.Fatalf("delete racing a reconnect: %v, want a precondition conflict", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the racer was never deleted")
	}
	kept := getRegistration(t, racer)
	if !meta.IsStatusConditionTrue(kept.Status.Conditions, runtimev1alpha1.ConditionAgentConnected) {
		t.Errorf("the racing reconnect was not kept: %+v", kept.Status)
	}
	if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(racerEntry), &istionetworkingv1.WorkloadEntry{}); err != nil {
		t.Errorf("WorkloadEntry of the reconnected registration: %v", err)
	}
}

// createReplicaLease writes the Lease of a replica as its heartbeat would.
func createReplicaLease(t *testing.T, ns, holder string, acquired, renewed time.Time, duration time.Duration) {
	t.Helper()
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: replica.LeaseName(holder), Namespace: ns, Labels: map[string]string{replica.LabelLease: "true"}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(holder),
			LeaseDurationSeconds: ptr.To(int32(duration / time.Second)),
			AcquireTime:          &metav1.MicroTime{Time: acquired},
			RenewTime:            &metav1.MicroTime{Time: renewed},
		},
	}
	if err := env.Client.Create(t.Context(), lease); err != nil {
		t.Fatal(err)
	}
}

func TestSweeperMarksConnectionsOfGoneReplicasThenRemoves(t *testing.T) {
	const grace = 4 * time.Second
	ns := env.Namespace(t)
	wg := lifecycleGroup(t, ns)
	now := time.Now()
	createReplicaLease(t, ns, "r-expired", now.Add(-time.Hour), now.Add(-time.Minute), 10*time.Second)
	createReplicaLease(t, ns, "r-expiring", now.Add(-time.Hour), now, 3*time.Second) // never renewed again
	createReplicaLease(t, ns, "r-restarted", now, now, time.Hour)

	tests := []struct {
		name        string
		replica     string
		connectedAt time.Time
		wantMessage string
	}{
		// In the order they are marked (each subtest waits for its
		// removal before the next looks): a missing Lease and a restart
		// count at once; an expired Lease only once the sweeper has led
		// for a Lease duration (ReplicaLeaseDuration, 2s here).
		{name: "no Lease", replica: "r-missing", connectedAt: now.Add(-10 * time.Minute), wantMessage: "has no Lease"},
		{name: "replica restarted", replica: "r-restarted", connectedAt: now.Add(-10 * time.Minute), wantMessage: "restarted"},
		{name: "Lease expired", replica: "r-expired", connectedAt: now.Add(-10 * time.Minute), wantMessage: "expired"},
		// Last: it is marked when its Lease expires, after the others.
		{name: "Lease expires later", replica: "r-expiring", connectedAt: now.Add(-10 * time.Minute), wantMessage: "expired"},
	}
	wars := make([]*runtimev1alpha1.WorkloadAutoRegistration, len(tests))
	for i, tt := range tests {
		war, _ := createRegistration(t, wg, i+1)
		wars[i] = setConnection(t, war, tt.replica, true, tt.connectedAt)
	}
	// The resync is out of the picture: the expiring Lease is noticed by
	// its expiry watch.
	h := startLifecycle(t, ns, "replica-a", func(o *Options) { o.GracePeriod = grace; o.ResyncPeriod = time.Hour })
	// A connection of the live replica is established after it started (a
	// connection stamped before its start would rightly count as one of a
	// previous run of the replica).
	select {
	case <-h.lc.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("replica-a never became ready")
	}
	live, _ := createRegistration(t, wg, 100)
	setConnection(t, live, "replica-a", true, time.Now())

	// Watch all of them at once: each is marked, then removed a grace
	// period later.
	marked := make([]*runtimev1alpha1.WorkloadAutoRegistration, len(tests))
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		done := true
		for i, war := range wars {
			if marked[i] != nil {
				continue
			}
			cur := &runtimev1alpha1.WorkloadAutoRegistration{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(war), cur); err != nil {
				return false, fmt.Errorf("%s: %w", tests[i].name, err)
			}
			cond := meta.FindStatusCondition(cur.Status.Conditions, runtimev1alpha1.ConditionAgentConnected)
			if cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == ReasonReplicaGone {
				marked[i] = cur
			} else {
				done = false
			}
		}
		return done, nil
	})
	if err != nil {
		t.Fatalf("registrations of gone replicas not marked %s: %v", ReasonReplicaGone, err)
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cond := meta.FindStatusCondition(marked[i].Status.Conditions, runtimev1alpha1.ConditionAgentConnected)
			if !strings.Contains(cond.Message, tt.replica) || !strings.Contains(cond.Message, tt.wantMessage) {
				t.Errorf("message = %q, want it to name %s and say %q", cond.Message, tt.replica, tt.wantMessage)
			}
			conn := marked[i].Status.Connection
			if conn == nil || conn.DisconnectedAt == nil || conn.Replica != tt.replica || conn.DisconnectedAt.Before(&metav1.Time{Time: now.Truncate(time.Second)}) {
				t.Fatalf("connection = %+v, want disconnectedAt set now, replica kept", conn)
			}
			waitRemovedOnTime(t, marked[i], conn.DisconnectedAt.Add(grace), onTime)
		})
	}
	fixtures.WaitEvent(t, env.Client, ns, wars[2].Name, ReasonReplicaGone, "r-expired")
	if got := h.removals(t, causeReplicaGone); got != float64(len(tests)) {
		t.Errorf("removals{cause=replica_gone} = %v, want %d", got, len(tests))
	}
	if got := metricValue(t, h.reg, "embark_registry_replica_gone_disconnects_total", ""); got != float64(len(tests)) {
		t.Errorf("replica_gone_disconnects_total = %v, want %d", got, len(tests))
	}
	// Connected to the live replica: untouched.
	cur := getRegistration(t, live)
	if !meta.IsStatusConditionTrue(cur.Status.Conditions, runtimev1alpha1.ConditionAgentConnected) {
		t.Errorf("registration connected to a live replica: %+v", cur.Status)
	}
}

func TestSweeperRestartRemovesOnTimeFromStoredTimestamps(t *testing.T) {
	const grace = 3 * time.Second
	ns := env.Namespace(t)
	wg := lifecycleGroup(t, ns)
	first := startLifecycle(t, ns, "replica-a", func(o *Options) { o.GracePeriod = grace })
	waitLeader(t, first)
	war, we := createRegistration(t, wg, 1)
	setConnection(t, war, "replica-a", true, time.Now())
	stored := setConnection(t, war, "replica-a", false, time.Now())
	deadline := stored.Status.Connection.DisconnectedAt.Add(grace)

	// The sweeper restarts within the grace period, as a new replica.
	first.stop(t)
	if !time.Now().Before(deadline) {
		t.Fatal("the first sweeper stopped after the grace period had ended; the test proves nothing")
	}
	second := startLifecycle(t, ns, "replica-b", func(o *Options) { o.GracePeriod = grace })
	waitRemovedOnTime(t, war, deadline, onTime)
	fixtures.WaitGone(t, env.Client, we)
	if got := second.removals(t, causeDisconnected); got != 1 {
		t.Errorf("removals by the new sweeper = %v, want 1", got)
	}
	if got := first.removals(t, ""); got != 0 {
		t.Errorf("removals by the stopped sweeper = %v, want 0", got)
	}
}

func waitLeader(t *testing.T, h *lifecycleHarness) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return h.lc.IsLeader(), nil
	})
	if err != nil {
		t.Fatal("never elected")
	}
}

// deleteCounter counts a client's deletes of registrations, with their times.
type deleteCounter struct {
	mu    sync.Mutex
	calls []time.Time
}

func (d *deleteCounter) client(c client.WithWatch) client.WithWatch {
	return interceptor.NewClient(c, interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if _, ok := obj.(*runtimev1alpha1.WorkloadAutoRegistration); ok {
				d.mu.Lock()
				d.calls = append(d.calls, time.Now())
				d.mu.Unlock()
			}
			return c.Delete(ctx, obj, opts...)
		},
	})
}

func (d *deleteCounter) times() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.calls)
}

func TestOnlyTheElectedSweeperRemoves(t *testing.T) {
	ns := env.Namespace(t)
	wg := lifecycleGroup(t, ns)
	counters := map[string]*deleteCounter{"replica-a": {}, "replica-b": {}}
	sweepers := map[string]*lifecycleHarness{}
	for name, c := range counters {
		sweepers[name] = startLifecycle(t, ns, name, func(o *Options) { o.Client = c.client(env.Client); o.APIReader = env.Client })
	}
	var wars []*runtimev1alpha1.WorkloadAutoRegistration
	for i := range 3 {
		war, _ := createRegistration(t, wg, i+1)
		wars = append(wars, war)
	}
	for _, war := range wars {
		waitRemovedOnTime(t, war, war.CreationTimestamp.Add(2*time.Second), onTime)
	}
	lease := &coordinationv1.Lease{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: SweeperLeaseName}, lease); err != nil {
		t.Fatal(err)
	}
	leader := ptr.Deref(lease.Spec.HolderIdentity, "")
	follower := map[string]string{"replica-a": "replica-b", "replica-b": "replica-a"}[leader]
	if follower == "" {
		t.Fatalf("sweeper Lease held by %q, want one of the two replicas", leader)
	}
	if n := len(counters[leader].times()); n != 3 {
		t.Errorf("leader %s deleted %d registrations, want 3", leader, n)
	}
	if n := len(counters[follower].times()); n != 0 {
		t.Errorf("follower %s deleted %d registrations, want 0", follower, n)
	}
	if !sweepers[leader].lc.IsLeader() || sweepers[follower].lc.IsLeader() {
		t.Errorf("IsLeader: %s=%v %s=%v", leader, sweepers[leader].lc.IsLeader(), follower, sweepers[follower].lc.IsLeader())
	}
	if got := metricValue(t, sweepers[leader].reg, "embark_registry_sweeper_leader", ""); got != 1 {
		t.Errorf("sweeper_leader of the leader = %v", got)
	}

	// The leader stops; the other takes over and sweeps.
	sweepers[leader].stop(t)
	war, _ := createRegistration(t, wg, 10)
	waitRemovedOnTime(t, war, war.CreationTimestamp.Add(2*time.Second), onTime)
	if n := len(counters[follower].times()); n != 1 {
		t.Errorf("new leader %s deleted %d registrations, want 1", follower, n)
	}
}

func TestRemovalsAreRateLimited(t *testing.T) {
	const (
		n   = 30
		qps = 10
	)
	ns := env.Namespace(t)
	wg := lifecycleGroup(t, ns)
	var wars []*runtimev1alpha1.WorkloadAutoRegistration
	for i := range n {
		war, _ := createRegistration(t, wg, i+1)
		wars = append(wars, war)
	}
	counter := &deleteCounter{}
	// A grace period of 1ns: every registration is expired at once.
	startLifecycle(t, ns, "replica-a", func(o *Options) {
		o.GracePeriod = time.Nanosecond
		o.RemovalQPS = qps
		o.Workers = 4
		o.Client = counter.client(env.Client)
		o.APIReader = env.Client
	})
	for _, war := range wars {
		fixtures.WaitGone(t, env.Client, war)
	}
	calls := counter.times()
	// Deletes that a concurrent status write made fail their precondition
	// are tried again, so there may be a few more deletes than registrations.
	if len(calls) < n {
		t.Errorf("%d deletes for %d registrations", len(calls), n)
	}
	slices.SortFunc(calls, func(a, b time.Time) int { return a.Compare(b) })
	// Burst 1 then qps per second: no window of two seconds holds more than
	// 2*qps+1 deletes (+1 for the time between the limiter and the record).
	const window, limit = 2 * time.Second, 2*qps + 2
	for i := range calls {
		j := i
		for j < len(calls) && calls[j].Sub(calls[i]) < window {
			j++
		}
		if j-i > limit {
			t.Fatalf("%d deletes within %s from %s, want at most %d", j-i, window, calls[i].Format(time.StampMilli), limit)
		}
	}
	if spread := calls[len(calls)-1].Sub(calls[0]); spread < time.Duration(float64(n-1)/qps*0.9*float64(time.Second)) {
		t.Errorf("%d deletes within %s, want them spread at %d/s", len(calls), spread, qps)
	}
}
