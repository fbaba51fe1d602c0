package rollout

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	istioapi "istio.io/api/networking/v1alpha3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/testenv"
)

var (
	env      *testenv.Env
	recorder record.EventRecorder
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	testenv.Main(m, testenv.Options{GarbageCollector: true}, &env, func(ctx context.Context) error {
		var err error
		recorder, err = env.EventRecorder(ctx, "embark-rollout-test")
		return err
	})
}

func TestMaxUnavailable(t *testing.T) {
	tests := []struct {
		name  string
		v     *intstr.IntOrString
		total int
		want  int
	}{
		{name: "unset", total: 10, want: 1},
		{name: "number", v: ptr.To(intstr.FromInt32(2)), total: 10, want: 2},
		{name: "percent rounds down", v: ptr.To(intstr.FromString("25%")), total: 10, want: 2},
		{name: "percent at least one", v: ptr.To(intstr.FromString("5%")), total: 10, want: 1},
		{name: "zero is one", v: ptr.To(intstr.FromInt32(0)), total: 10, want: 1},
		{name: "garbage is one", v: ptr.To(intstr.FromString("x")), total: 10, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := MaxUnavailable(tt.v, tt.total); got != tt.want {
				t.Errorf("MaxUnavailable = %d, want %d", got, tt.want)
			}
		})
	}
}

// fleet simulates the agents of n workloads the way the real agent
// behaves towards the registry (onboarding/agent, with its registration
// watch): when its registration is deleted, it registers again after a
// short delay with a snapshot of the group's current spec, and its sidecar
// connects (AgentConnected=True) and reports its probe (Healthy) a moment
// later. The real agent, pilot-agent and endpoint are exercised by
// onboarding/agent/integration; this test is about the rollout's pacing.
type fleet struct {
	t      *testing.T
	ns     string
	group  string
	n      int
	broken sync.Map // name -> true: comes back but its probe fails
	mu     sync.Mutex
	log    []string
	start  time.Time
}

func (f *fleet) name(i int) string { return fmt.Sprintf("ratings-vm-%02d", i) }

func (f *fleet) note(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, fmt.Sprintf("%6.2fs  ", time.Since(f.start).Seconds())+fmt.Sprintf(format, args...))
}

// register creates workload i's registration from the group as it is now,
// connected, Healthy unless broken.
func (f *fleet) register(ctx context.Context, i int) error {
	group := &istionetworkingv1.WorkloadGroup{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: f.group}, group); err != nil {
		return err
	}
	snap, err := registry.Snapshot(group)
	if err != nil {
		return err
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{
		ObjectMeta: metav1.ObjectMeta{Name: f.name(i), Namespace: f.ns, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: istionetworkingv1.SchemeGroupVersion.String(), Kind: "WorkloadGroup", Name: group.Name, UID: group.UID, Controller: ptr.To(true),
		}}},
		Spec: runtimev1alpha1.WorkloadAutoRegistrationSpec{
			Identity:      fixtures.AWSIdentity(fmt.Sprintf("i-%017x", i)),
			Registration:  fixtures.Registration(fmt.Sprintf("10.0.0.%d", i+1)),
			WorkloadGroup: snap,
		},
	}
	if err := env.Client.Create(ctx, war); err != nil {
		return err
	}
	time.Sleep(100 * time.Millisecond) // the sidecar starts and connects
	now := metav1.Now()
	war.Status.Connection = &runtimev1alpha1.ConnectionStatus{Replica: "replica-a", ConnectedAt: &now}
	meta.SetStatusCondition(&war.Status.Conditions, metav1.Condition{Type: runtimev1alpha1.ConditionAgentConnected, Status: metav1.ConditionTrue, Reason: runtimev1alpha1.ReasonAgentEstablishedConnection, LastTransitionTime: now})
	healthy, reason := metav1.ConditionTrue, runtimev1alpha1.ReasonProbeSucceeded
	if _, bad := f.broken.Load(war.Name); bad {
		healthy, reason = metav1.ConditionFalse, runtimev1alpha1.ReasonProbeFailed
	}
	meta.SetStatusCondition(&war.Status.Conditions, metav1.Condition{Type: runtimev1alpha1.ConditionHealthy, Status: healthy, Reason: reason, LastTransitionTime: now})
	return env.Client.Status().Update(ctx, war)
}

// setHealthy rewrites workload name's Healthy condition.
func (f *fleet) setHealthy(ctx context.Context, name string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		war := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: name}, war); err != nil {
			return err
		}
		meta.SetStatusCondition(&war.Status.Conditions, metav1.Condition{Type: runtimev1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: runtimev1alpha1.ReasonProbeSucceeded, LastTransitionTime: metav1.Now()})
		return env.Client.Status().Update(ctx, war)
	})
}

// run re-registers deleted workloads until ctx ends, and samples: the most
// workloads unavailable (no registration, or not connected) at once.
func (f *fleet) run(ctx context.Context, maxUnavailable *atomic.Int32) {
	for ctx.Err() == nil {
		list := &runtimev1alpha1.WorkloadAutoRegistrationList{}
		if err := env.Client.List(ctx, list, client.InNamespace(f.ns)); err != nil {
			continue
		}
		present := map[string]*runtimev1alpha1.WorkloadAutoRegistration{}
		for i := range list.Items {
			if list.Items[i].DeletionTimestamp == nil {
				present[list.Items[i].Name] = &list.Items[i]
			}
		}
		unavailable := int32(0)
		for i := range f.n {
			w := present[f.name(i)]
			if w == nil || !meta.IsStatusConditionTrue(w.Status.Conditions, runtimev1alpha1.ConditionAgentConnected) {
				unavailable++
			}
			if w == nil {
				f.note("%s asked to onboard again (registration deleted); onboarding", f.name(i))
				if err := f.register(ctx, i); err != nil && !apierrors.IsAlreadyExists(err) && ctx.Err() == nil {
					f.t.Logf("re-register %s: %v", f.name(i), err)
				} else if err == nil {
					f.note("%s back: registered with the current spec, connected", f.name(i))
				}
			}
		}
		for {
			old := maxUnavailable.Load()
			if unavailable <= old || maxUnavailable.CompareAndSwap(old, unavailable) {
				break
			}
		}
		time.Sleep(30 * time.Millisecond)
	}
}

func startController(t *testing.T, ns string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	informers, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = informers.Start(ctx) }()
	c, err := New(Options{Client: env.Client, Cache: informers, Recorder: recorder, RecheckInterval: 200 * time.Millisecond, AskQPS: 50,
		Logger: fixtures.Logger(t)})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("controller: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func getRollout(t *testing.T, ns, name string) *runtimev1alpha1.WorkloadGroupRollout {
	t.Helper()
	ro := &runtimev1alpha1.WorkloadGroupRollout{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, ro); err != nil {
		t.Fatal(err)
	}
	return ro
}

func waitRollout(t *testing.T, ns, name string, timeout time.Duration, what string, cond func(*runtimev1alpha1.WorkloadGroupRollout) bool) *runtimev1alpha1.WorkloadGroupRollout {
	t.Helper()
	var ro *runtimev1alpha1.WorkloadGroupRollout
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ro = getRollout(t, ns, name)
		return cond(ro), nil
	})
	if err != nil {
		t.Fatalf("rollout %s: %s: %v; status %+v", name, what, err, ro.Status)
	}
	return ro
}

func complete(ro *runtimev1alpha1.WorkloadGroupRollout) bool {
	c := meta.FindStatusCondition(ro.Status.Conditions, runtimev1alpha1.RolloutConditionProgressing)
	return c != nil && c.Reason == runtimev1alpha1.ReasonRolloutComplete && c.ObservedGeneration == ro.Generation && ro.Status.Updated == ro.Status.Total
}

// Ten workloads, maxUnavailable 2: never more than two unavailable at once,
// all updated at the end, a replica taking over mid-way continues, and a
// workload whose probe fails after re-onboarding pauses the rollout (with
// an Event naming it) until it is healthy and the rollout is resumed.
func TestRollingUpdate(t *testing.T) {
	ns := env.Namespace(t)
	ctx := t.Context()
	group := &istionetworkingv1.WorkloadGroup{ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: ns}}
	group.Spec.Template = &istioapi.WorkloadEntry{Labels: map[string]string{"app": "ratings", "version": "v1"}, ServiceAccount: "ratings-vm"}
	group.Spec.Probe = &istioapi.ReadinessProbe{HealthCheckMethod: &istioapi.ReadinessProbe_HttpGet{HttpGet: &istioapi.HTTPHealthCheckConfig{Path: "/ready", Port: 8080}}}
	if err := env.Client.Create(ctx, group); err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, ns: ns, group: "ratings", n: 10, start: time.Now()}
	for i := range f.n {
		if err := f.register(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	ro := &runtimev1alpha1.WorkloadGroupRollout{
		ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: ns},
		Spec: runtimev1alpha1.WorkloadGroupRolloutSpec{WorkloadGroup: "ratings", MaxUnavailable: ptr.To(intstr.FromInt32(2)),
			ProgressDeadlineSeconds: ptr.To[int32](60)},
	}
	if err := env.Client.Create(ctx, ro); err != nil {
		t.Fatal(err)
	}
	stopFirst := startController(t, ns)
	waitRollout(t, ns, "ratings", 30*time.Second, "complete before any change", complete)

	var most atomic.Int32
	fctx, stopFleet := context.WithCancel(ctx)
	fleetDone := make(chan struct{})
	go func() { defer close(fleetDone); f.run(fctx, &most) }()
	defer func() { stopFleet(); <-fleetDone }()

	changeGroup := func(version string) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			g := &istionetworkingv1.WorkloadGroup{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(group), g); err != nil {
				return err
			}
			g.Spec.Template.Labels["version"] = version
			return env.Client.Update(ctx, g)
		})
		if err != nil {
			t.Fatal(err)
		}
		f.note("WorkloadGroup changed: template.labels.version=%s", version)
	}

	t.Log("the group changes: rolled out two at a time")
	changeGroup("v2")
	// A takeover mid-way: the first controller stops once batch 2 runs, a
	// new one (another replica) continues from the status.
	waitRollout(t, ns, "ratings", 60*time.Second, "batch 2 started", func(ro *runtimev1alpha1.WorkloadGroupRollout) bool { return ro.Status.Batches >= 2 })
	stopFirst()
	f.note("the sweeping replica stopped; another takes over")
	startController(t, ns)
	done := waitRollout(t, ns, "ratings", 2*time.Minute, "all updated", func(ro *runtimev1alpha1.WorkloadGroupRollout) bool {
		return complete(ro) && ro.Status.WorkloadGroupGeneration == 2
	})
	f.note("rollout complete: %d/%d updated in %d batches", done.Status.Updated, done.Status.Total, done.Status.Batches)
	if got := most.Load(); got > 2 || got == 0 {
		t.Errorf("at most %d workloads were unavailable at once, want 1 or 2", got)
	}
	if done.Status.Total != 10 || done.Status.Updated != 10 || done.Status.Batches < 5 {
		t.Errorf("status %+v, want 10/10 updated in at least 5 batches", done.Status)
	}

	t.Log("a workload whose probe fails after re-onboarding pauses the rollout")
	f.broken.Store(f.name(0), true)
	if err := env.Client.Patch(ctx, getRollout(t, ns, "ratings"), client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"progressDeadlineSeconds":5}}`))); err != nil {
		t.Fatal(err)
	}
	changeGroup("v3")
	paused := waitRollout(t, ns, "ratings", time.Minute, "paused", func(ro *runtimev1alpha1.WorkloadGroupRollout) bool {
		return ro.Spec.Paused && meta.IsStatusConditionTrue(ro.Status.Conditions, runtimev1alpha1.RolloutConditionPaused)
	})
	f.note("rollout paused: %s", meta.FindStatusCondition(paused.Status.Conditions, runtimev1alpha1.RolloutConditionPaused).Message)
	if c := meta.FindStatusCondition(paused.Status.Conditions, runtimev1alpha1.RolloutConditionPaused); c.Reason != runtimev1alpha1.ReasonProgressDeadlineExceeded || !strings.Contains(c.Message, f.name(0)) {
		t.Errorf("Paused condition %+v, want ProgressDeadlineExceeded naming %s", c, f.name(0))
	}
	fixtures.WaitEvent(t, env.Client, ns, "ratings", runtimev1alpha1.ReasonProgressDeadlineExceeded, f.name(0))
	// Paused: no new batch starts.
	batches := paused.Status.Batches
	time.Sleep(time.Second)
	if got := getRollout(t, ns, "ratings"); got.Status.Batches != batches {
		t.Errorf("a batch started while paused: %d -> %d", batches, got.Status.Batches)
	}

	t.Log("fixed and resumed: completes")
	f.broken.Delete(f.name(0))
	if err := f.setHealthy(ctx, f.name(0)); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Patch(ctx, getRollout(t, ns, "ratings"), client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"paused":false,"progressDeadlineSeconds":60}}`))); err != nil {
		t.Fatal(err)
	}
	f.note("rollout resumed")
	done = waitRollout(t, ns, "ratings", 2*time.Minute, "all updated after resume", func(ro *runtimev1alpha1.WorkloadGroupRollout) bool {
		return complete(ro) && ro.Status.WorkloadGroupGeneration == 3
	})
	f.note("rollout complete: %d/%d updated", done.Status.Updated, done.Status.Total)
	if got := most.Load(); got > 2 {
		t.Errorf("at most %d workloads were unavailable at once, want at most 2", got)
	}
	f.mu.Lock()
	t.Logf("rollout timeline (max unavailable at once: %d):\n%s", most.Load(), strings.Join(f.log, "\n"))
	f.mu.Unlock()
}
