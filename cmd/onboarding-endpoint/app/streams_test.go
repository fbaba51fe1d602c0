package app

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/structpb"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/adsclient"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/fixtures"
)

// process is one onboarding endpoint process (app.Run) of a test.
type process struct {
	replica string
	xds     string
	cancel  context.CancelFunc
	done    chan error
}

// startEndpoint runs the endpoint as replica with its own listeners; it
// serves workloads of ns, keeps its Leases there, and removes registrations
// after grace.
func startEndpoint(t *testing.T, ns, replica string, grace time.Duration) *process {
	t.Helper()
	dir := t.TempDir()
	e := &process{replica: replica, xds: freeAddr(t), done: make(chan error, 1)}
	cfg := configkit.Config(ns)
	cfg.Registration.GracePeriod = configkit.Duration(grace)
	cfg.Listen = config.Listen{Onboarding: freeAddr(t), Metrics: freeAddr(t), XDS: e.xds}
	file := configkit.WriteFile(t, dir, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	ready := make(chan struct{})
	go func() {
		e.done <- Run(ctx, Options{ConfigFile: file, Kubeconfig: env.KubeconfigPath, Replica: replica, DebugXDS: "off",
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Ready: ready})
	}()
	select {
	case <-ready:
	case err := <-e.done:
		t.Fatalf("Run %s: %v", replica, err)
	case <-time.After(2 * time.Minute):
		t.Fatalf("endpoint %s not ready", replica)
	}
	t.Cleanup(func() { e.stop(t) })
	return e
}

// stop shuts the endpoint down as a rollout would, and waits for it.
func (e *process) stop(t *testing.T) {
	t.Helper()
	if e.cancel == nil {
		return
	}
	e.cancel()
	e.cancel = nil
	select {
	case err := <-e.done:
		if err != nil {
			t.Errorf("Run %s returned %v after shutdown", e.replica, err)
		}
	case <-time.After(time.Minute):
		t.Errorf("Run %s did not stop", e.replica)
	}
}

// sidecar is a workload registered in ns, whose ADS streams speak like
// Istio's agent.
type sidecar struct {
	key    client.ObjectKey
	uid    string
	token  string
	nodeID string
}

func registerSidecar(t *testing.T, ns, ip string) *sidecar {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	wg := fixtures.WorkloadGroup(ns, nil)
	fixtures.CreateGroup(ctx, t, env.Client, wg)
	c, err := env.StartCache(ctx, func(c cache.Cache) error { return registry.SetupIndexes(ctx, c) }, &istionetworkingv1.WorkloadEntryList{})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.NewRegistrar(registry.Options{Client: env.Client, Cache: c, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := reg.Write(ctx, registry.Request{Group: wg, Identity: fixtures.AWSIdentity("i-0123456789abcdef0"), Registration: fixtures.Registration(ip)})
	if err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(res.Registration)
	return &sidecar{key: key, uid: string(res.Registration.UID), token: res.SidecarToken.Token,
		nodeID: fixtures.NodeID(ip, key)}
}

// connect opens an ADS stream to addr, subscribes to listeners and ACKs the
// first response; the returned func closes the stream.
func (s *sidecar) connect(t *testing.T, addr string) func() {
	t.Helper()
	conn, err := adsclient.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	node := &core.Node{Id: s.nodeID, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"PROXY_CONFIG": structpb.NewStructValue(&structpb.Struct{}),
	}}}
	st, err := adsclient.OpenSotW(context.Background(), conn, s.token, node)
	if err != nil {
		_ = conn.Close()
		t.Fatal(err)
	}
	closeAll := func() { st.Close(); _ = conn.Close() }
	t.Cleanup(closeAll)
	if err := st.Request(resource.ListenerType); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Next()
	if err != nil {
		t.Fatalf("stream to %s: %v", addr, err)
	}
	if err := st.ACK(resp); err != nil {
		t.Fatal(err)
	}
	return closeAll
}

// state is the registration's AgentConnected status and holder.
func (s *sidecar) state(t *testing.T) (metav1.ConditionStatus, string) {
	t.Helper()
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), s.key, war); err != nil {
		t.Fatal(err)
	}
	if string(war.UID) != s.uid {
		t.Fatalf("registration %s was re-created", s.key)
	}
	var st metav1.ConditionStatus
	if c := meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected); c != nil {
		st = c.Status
	}
	var replica string
	if war.Status.Connection != nil {
		replica = war.Status.Connection.Replica
	}
	return st, replica
}

func (s *sidecar) waitState(t *testing.T, status metav1.ConditionStatus, replica string) {
	t.Helper()
	var gotS metav1.ConditionStatus
	var gotR string
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		gotS, gotR = s.state(t)
		return gotS == status && gotR == replica, nil
	})
	if err != nil {
		t.Fatalf("%s: AgentConnected=%s on %q, want %s on %q", s.key.Name, gotS, gotR, status, replica)
	}
}

// watchFalse records every AgentConnected=False the registration shows
// from now on.
func (s *sidecar) watchFalse(t *testing.T) func() []string {
	t.Helper()
	w, err := env.Client.Watch(t.Context(), &runtimev1alpha1.WorkloadAutoRegistrationList{},
		client.InNamespace(s.key.Namespace), client.MatchingFields{"metadata.name": s.key.Name})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			war, ok := ev.Object.(*runtimev1alpha1.WorkloadAutoRegistration)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			if c := meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected); c != nil && c.Status == metav1.ConditionFalse {
				mu.Lock()
				seen = append(seen, c.Reason+" at resourceVersion "+war.ResourceVersion)
				mu.Unlock()
			}
		}
	}()
	return func() []string {
		w.Stop()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// Two endpoint processes against one API server: a workload moving from
// replica A to replica B (the new stream opens before the old one closes)
// is never stored disconnected; B restarting (a rollout) while A runs hands
// the workload over: still never stored disconnected, the registration left
// in place, and the reconnect to the new process stores the connection
// anew; nothing is re-created.
func TestTakeoverAndRestartKeepALiveWorkloadConnected(t *testing.T) {
	ns := env.Namespace(t)
	const grace = time.Minute
	a := startEndpoint(t, ns, "embark-a", grace)
	b := startEndpoint(t, ns, "embark-b", grace)
	s := registerSidecar(t, ns, "172.31.9.1")

	closeA := s.connect(t, a.xds)
	s.waitState(t, metav1.ConditionTrue, "embark-a")

	// Takeover: the sidecar moves to B, then its stream to A closes.
	falses := s.watchFalse(t)
	closeB := s.connect(t, b.xds)
	s.waitState(t, metav1.ConditionTrue, "embark-b")
	closeA()
	// Replica A's held disconnect (1s) is due by now; it must not apply.
	time.Sleep(3 * time.Second)
	s.waitState(t, metav1.ConditionTrue, "embark-b")
	if got := falses(); len(got) > 0 {
		t.Errorf("the workload was stored disconnected while connected to B: %v", got)
	}

	// Rollout of B while A runs: the old process hands its workload over
	// (no disconnect written, its Lease left to expire); the sidecar
	// reconnects to the new process well within the Lease's duration and
	// the grace period, the new process stores its connection, nothing is
	// removed, and the workload is never stored disconnected.
	stopped := metav1.Now()
	b.stop(t)
	closeB()
	b2 := startEndpoint(t, ns, "embark-b", grace)
	s.connect(t, b2.xds)
	fixtures.Eventually(t, 30*time.Second, "the new process's connection stored", func() bool {
		war := &runtimev1alpha1.WorkloadAutoRegistration{}
		return env.Client.Get(t.Context(), s.key, war) == nil && war.Status.Connection != nil &&
			war.Status.Connection.Replica == "embark-b" && war.Status.Connection.DisconnectedAt == nil &&
			war.Status.Connection.ConnectedAt != nil && !war.Status.Connection.ConnectedAt.Before(&metav1.Time{Time: stopped.Truncate(time.Second)})
	})
	s.waitState(t, metav1.ConditionTrue, "embark-b")
	if got := falses(); len(got) > 0 {
		t.Errorf("the workload was stored disconnected during B's rollout: %v", got)
	}
	if we := (&istionetworkingv1.WorkloadEntry{}); env.Client.Get(t.Context(), s.key, we) != nil {
		t.Errorf("the WorkloadEntry of %s is gone", s.key.Name)
	}
}
