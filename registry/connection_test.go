package registry

import (
	"context"
	"testing"
	"time"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
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
	o.weController = we.Annotations[AnnotationWorkloadController]
	o.weDisconnected = we.Annotations[AnnotationDisconnectedAt] != ""
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
		return observed{status: metav1.ConditionFalse, reason: runtimev1alpha1.ReasonAgentDisconnected, replica: r, disconnected: true, weController: r, weDisconnected: true}
	}
)

func registerForConnections(t *testing.T) (Workload, *Result) {
	t.Helper()
	ns := env.Namespace(t)
	wg := createGroup(t, ns)
	res, err := newRegistrar(t, nil).Register(t.Context(), Request{Group: wg, Identity: ec2Identity("i-1234567890abcdef0"), Registration: registration("172.31.5.254")})
	if err != nil {
		t.Fatal(err)
	}
	return Workload{Key: client.ObjectKeyFromObject(res.Registration), UID: res.Registration.UID, Group: wg.Name}, res
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
	if war.Status.Connection.ConnectedAt == nil || we.Annotations[AnnotationConnectedAt] == "" {
		t.Errorf("connectedAt: status %v, annotation %q", war.Status.Connection.ConnectedAt, we.Annotations[AnnotationConnectedAt])
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
	if err := env.Client.Get(ctx, w.Key, we); err != nil || we.Annotations[AnnotationDisconnectedAt] != "" {
		t.Errorf("reconnect kept disconnectedAt: %v (%v)", we.Annotations, err)
	}
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
	waitGone(t, res.Registration)
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
// replica's Lease lapsed), and does nothing for workloads it holds no stream of.
func TestReassertRestoresALiveConnection(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w, _ := registerForConnections(t)
	c := newConnections(t, ctx, "replica-a", nil)
	c.Opened(w, 1)
	waitObserved(t, w.Key, connectedTo("replica-a"))

	markGone := func() *runtimev1alpha1.WorkloadAutoRegistration {
		t.Helper()
		war := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := env.Client.Get(ctx, w.Key, war); err != nil {
			t.Fatal(err)
		}
		meta.SetStatusCondition(&war.Status.Conditions, metav1.Condition{Type: runtimev1alpha1.ConditionAgentConnected, Status: metav1.ConditionFalse, Reason: ReasonReplicaGone})
		now := metav1.Now()
		war.Status.Connection.DisconnectedAt = &now
		if err := env.Client.Status().Update(ctx, war); err != nil {
			t.Fatal(err)
		}
		return war
	}
	c.Reassert(markGone())
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
}
