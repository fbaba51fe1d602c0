package rollout

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	istioapi "istio.io/api/networking/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/endpointkit"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/freeport"
	"github.com/embark-mesh/embark/test/testenv"
	"github.com/embark-mesh/embark/test/vmsim"
)

const (
	endpointHost   = "onboarding-endpoint.rollout.test"
	workloads      = 10
	maxUnavailable = 2
	// waitFor bounds each phase: ten pilot-agents on a loaded 2-core
	// machine start and connect within it.
	waitFor = 4 * time.Minute
)

// Ten VMs with real onboarding agents and pilot-agents, a WorkloadGroup
// with a readiness probe, a WorkloadGroupRollout with maxUnavailable 2:
//
//   - the group changes: every workload onboards again with the new spec,
//     and a watch of the registrations never sees more than two workloads
//     unavailable (registration gone, sidecar disconnected, or unhealthy)
//     at once;
//   - the group changes again and one VM's application fails its probe
//     after re-onboarding: the rollout pauses (Paused=True,
//     ProgressDeadlineExceeded, an Event naming the workload) and starts no
//     new batch; the VM is fixed and the rollout resumed (kubectl patch, as
//     docs/lifecycle.md shows): it completes;
//   - the group changes a third time and the rollout is aborted (kubectl
//     delete wgr) during its first batch: that batch's workloads come back
//     with the new spec, no other workload is asked.
//
// The timeline (batches; each workload's registration deleted, registered,
// connected, healthy) is logged.
func TestRolloutWithRealAgents(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	tl := &timeline{start: time.Now()}
	t.Cleanup(func() { t.Logf("rollout timeline (seconds since the fleet was up):\n%s", tl.String()) })

	dir := t.TempDir()
	certFile, keyFile, caFile := writeServingCert(t, dir)
	ca, err := awstest.NewCA("us-east-2")
	must(t, err)
	sts := awstest.NewSTS()
	t.Cleanup(sts.Close)
	certs := filepath.Join(dir, "aws-certs")
	must(t, os.MkdirAll(certs, 0o755))
	must(t, os.WriteFile(filepath.Join(certs, "us-east-2.pem"), ca.CertificatePEM(), 0o644))
	appPort := freePort(t)

	// The group, its service account, the example policy.
	group := fixtures.WorkloadGroup(ns, map[string]string{"app": "ratings", "version": "v1"})
	// Three failures, 5 s timeouts: a loaded machine does not flip a
	// healthy workload.
	group.Spec.Probe = &istioapi.ReadinessProbe{PeriodSeconds: 1, TimeoutSeconds: 5, FailureThreshold: 3, SuccessThreshold: 1,
		HealthCheckMethod: &istioapi.ReadinessProbe_HttpGet{HttpGet: &istioapi.HTTPHealthCheckConfig{Path: "/ready", Port: uint32(appPort)}}}
	fixtures.CreateGroup(ctx, t, env.Client, group)
	root, err := testenv.RepoRoot()
	must(t, err)
	data, err := os.ReadFile(filepath.Join(root, "api/crds/testdata/seed004/policy-any-ec2-in-accounts.yaml"))
	must(t, err)
	policy := &authorizationv1alpha1.OnboardingPolicy{}
	must(t, yaml.UnmarshalStrict(data, policy))
	policy.Namespace = ns
	must(t, env.Client.Create(ctx, policy))

	stopEndpoint := startEndpoint(t, dir, ns, certFile, keyFile, caFile, certs, sts.URL)

	// The fleet.
	vms := make([]*fleetVM, workloads)
	byInstance := map[string]*fleetVM{}
	for i := range vms {
		v := newFleetVM(t, i, ca, sts)
		vms[i], byInstance[v.IMDS.Instance().InstanceID] = v, v
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, v := range vms {
			wg.Go(v.shutdown)
		}
		wg.Wait()
		stopEndpoint()
	})
	settings := fleetSettings{endpoint: endpointAddr, caFile: caFile, stsURL: sts.URL, appPort: appPort, ns: ns}
	for _, v := range vms {
		v.start(t, settings, tl.note)
	}
	w := newWatcher(t, ns, byInstance, tl)
	started := time.Now()
	w.waitAll(t, "the fleet onboarded, connected and healthy", func(s wstate) bool { return s.ready() && s.version == "v1" })
	t.Logf("%d VMs onboarded, connected and healthy in %v", workloads, time.Since(started).Round(time.Second))
	tl.reset()
	w.measure()

	// Opt the group in: nothing to do yet.
	kubectl(t, "apply", "-f", "-", "--", fmt.Sprintf(`apiVersion: runtime.onboarding.tetrate.io/v1alpha1
kind: WorkloadGroupRollout
metadata: {name: ratings, namespace: %s}
spec:
  workloadGroup: ratings
  maxUnavailable: %d
  progressDeadlineSeconds: 120
`, ns, maxUnavailable))
	waitRollout(t, ns, "complete before any change", func(ro *runtimev1alpha1.WorkloadGroupRollout) bool { return complete(ro, 1) })

	t.Log("the group changes (version v2): rolled out two at a time")
	uids := w.uids()
	setVersion(t, ns, "v2", tl)
	ro := waitRollout(t, ns, "v2 rolled out", func(ro *runtimev1alpha1.WorkloadGroupRollout) bool { return complete(ro, 2) })
	tl.note("rollout complete: %d/%d updated in %d batches", ro.Status.Updated, ro.Status.Total, ro.Status.Batches)
	w.waitAll(t, "every workload back with v2", func(s wstate) bool { return s.ready() && s.version == "v2" })
	for inst, s := range w.snapshot() {
		if s.uid == uids[inst] {
			t.Errorf("%s kept its registration %s: not re-onboarded", byInstance[inst].Name, s.uid)
		}
	}
	for _, v := range vms {
		if n := v.sidecarRestarts(); n != 2 {
			t.Errorf("%s: %d sidecar restarts, want 2 (onboarded, re-onboarded once)", v.Name, n)
		}
	}
	if ro.Status.Total != workloads || ro.Status.Updated != workloads || ro.Status.Batches != workloads/maxUnavailable {
		t.Errorf("rollout status %+v, want %d/%d updated in %d batches", ro.Status, workloads, workloads, workloads/maxUnavailable)
	}
	if most, gone := w.most(); most != maxUnavailable || gone > maxUnavailable {
		t.Errorf("at most %d workloads unavailable at once (%d out of date and disconnected), want exactly %d (at most %d)", most, gone, maxUnavailable, maxUnavailable)
	}

	t.Log("the group changes (v3); one VM's application fails its probe after re-onboarding: the rollout pauses")
	batchesBefore := ro.Status.Batches
	// The fifth registration by name is in batch 3.
	names := w.names()
	broken := byInstance[names[4].instance]
	brokenReg := names[4].name
	broken.breakOnRestart.Store(true)
	kubectl(t, "patch", "wgr", "ratings", "-n", ns, "--type", "merge", "-p", `{"spec":{"progressDeadlineSeconds":20}}`)
	setVersion(t, ns, "v3", tl)
	ro = waitRollout(t, ns, "paused", func(ro *runtimev1alpha1.WorkloadGroupRollout) bool {
		return ro.Spec.Paused && meta.IsStatusConditionTrue(ro.Status.Conditions, runtimev1alpha1.RolloutConditionPaused)
	})
	c := meta.FindStatusCondition(ro.Status.Conditions, runtimev1alpha1.RolloutConditionPaused)
	tl.note("rollout paused: %s: %s", c.Reason, c.Message)
	if c.Reason != runtimev1alpha1.ReasonProgressDeadlineExceeded || !strings.Contains(c.Message, brokenReg) {
		t.Errorf("Paused condition %s/%s, want ProgressDeadlineExceeded naming %s", c.Reason, c.Message, brokenReg)
	}
	// Batch numbers count on from the first rollout; both workloads of the
	// third batch registered again with v3 (updated), one is not Healthy.
	if b := ro.Status.Batch; b == nil || b.Number != batchesBefore+3 || ro.Status.Updated != 6 || !b.DeadlineExceeded {
		t.Errorf("paused at %+v (updated %d), want the third batch of this change (%d), 6 workloads updated", b, ro.Status.Updated, batchesBefore+3)
	}
	waitEvent(t, ns, "ratings", runtimev1alpha1.ReasonProgressDeadlineExceeded, brokenReg)
	if s := w.snapshot()[broken.IMDS.Instance().InstanceID]; !s.connected || s.healthy || s.version != "v3" {
		t.Errorf("%s: %+v, want connected with v3 and unhealthy", broken.Name, s)
	}
	// Paused: no new batch starts (two rechecks of the controller).
	time.Sleep(2 * registryRecheck)
	if got := getRollout(t, ns); got.Status.Batches != ro.Status.Batches {
		t.Errorf("a batch started while paused: %d -> %d", ro.Status.Batches, got.Status.Batches)
	}

	t.Log("the VM is fixed and the rollout resumed: it completes")
	broken.breakOnRestart.Store(false)
	broken.App.SetHealthy(true)
	tl.note("%s's application fixed: /ready answers 200", broken.Name)
	kubectl(t, "patch", "wgr", "ratings", "-n", ns, "--type", "merge", "-p", `{"spec":{"paused":false}}`)
	tl.note("rollout resumed: kubectl patch wgr ratings --type merge -p '{\"spec\":{\"paused\":false}}'")
	ro = waitRollout(t, ns, "v3 rolled out", func(ro *runtimev1alpha1.WorkloadGroupRollout) bool { return complete(ro, 3) })
	tl.note("rollout complete: %d/%d updated in %d batches", ro.Status.Updated, ro.Status.Total, ro.Status.Batches)
	w.waitAll(t, "every workload back with v3", func(s wstate) bool { return s.ready() && s.version == "v3" })

	t.Log("the group changes (v4) and the rollout is aborted during its first batch")
	uids = w.uids()
	setVersion(t, ns, "v4", tl)
	ro = waitRollout(t, ns, "a batch started", func(ro *runtimev1alpha1.WorkloadGroupRollout) bool {
		return ro.Status.Batch != nil && ro.Status.WorkloadGroupGeneration == 4
	})
	kubectl(t, "delete", "wgr", "ratings", "-n", ns)
	tl.note("rollout aborted: kubectl delete wgr ratings")
	var asked []string
	for _, m := range ro.Status.Batch.Workloads {
		asked = append(asked, m.Name)
	}
	w.waitFor(t, "the aborted batch back with v4", func(all map[string]wstate) bool {
		n := 0
		for _, s := range all {
			if s.ready() && s.version == "v4" {
				n++
			}
		}
		return n == len(asked)
	})
	time.Sleep(2 * registryRecheck)
	for inst, s := range w.snapshot() {
		switch {
		case slices.Contains(asked, s.name):
			if s.version != "v4" || s.uid == uids[inst] {
				t.Errorf("%s (batch of the aborted rollout): %+v, want re-onboarded with v4", s.name, s)
			}
		case s.uid != uids[inst] || s.version != "v3":
			t.Errorf("%s: re-onboarded after the abort (%+v)", s.name, s)
		}
	}
	if most, gone := w.most(); most > maxUnavailable || gone > maxUnavailable {
		t.Errorf("at most %d workloads unavailable at once (%d out of date and disconnected), want at most %d", most, gone, maxUnavailable)
	}
	w.stop()
	most, gone := w.most()
	tl.note("most workloads unavailable at once: %d (out of date and disconnected: %d); maxUnavailable %d", most, gone, maxUnavailable)
}

// registryRecheck is the rollout controller's RecheckInterval (default).
const registryRecheck = 2 * time.Second

var endpointAddr string

// startEndpoint runs the onboarding endpoint (cmd/onboarding-endpoint's
// app.Run) with a one-replica sweeper, so that it drives the rollout.
func startEndpoint(t *testing.T, dir, ns, certFile, keyFile, caFile, certs, stsURL string) (stop func()) {
	t.Helper()
	xdsAddr := fixtures.FreeAddr(t)
	cfg := configkit.Serving(configkit.Config(ns), certFile, keyFile)
	cfg.Endpoint.Hosts = []string{endpointHost}
	cfg.Identity.AWS = config.AWSIdentity{CertificatesDir: certs, STSEndpoint: stsURL}
	cfg.Mesh = config.Mesh{DiscoveryAddress: xdsAddr, RootCertFile: caFile}
	cfg.Registration.AllowLoopbackAddresses = true
	cfg.Registration.HealthDamping = configkit.Duration(0)
	cfg.Registration.GracePeriod = configkit.Duration(time.Hour)
	cfg.Registration.PropagationDelay = configkit.Duration(time.Second)
	cfg.Listen.XDS = xdsAddr
	logs := &vmsim.SyncBuffer{}
	e := endpointkit.Start(t, endpointkit.Options{Config: cfg, Kubeconfig: env.KubeconfigPath, Replica: "rollout-test-0",
		Logger: slog.New(slog.NewTextHandler(logs, nil)), Dir: dir})
	endpointAddr = e.Config.Listen.Onboarding
	return func() {
		e.Stop()
		if t.Failed() {
			t.Logf("endpoint log (rollout lines):\n%s", grepLines(logs.String(), "rollout"))
		}
	}
}

func grepLines(s, word string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// setVersion changes the group's template label version with kubectl.
func setVersion(t *testing.T, ns, version string, tl *timeline) {
	t.Helper()
	kubectl(t, "patch", "workloadgroup", "ratings", "-n", ns, "--type", "merge", "-p", fmt.Sprintf(`{"spec":{"template":{"labels":{"version":%q}}}}`, version))
	tl.note("WorkloadGroup changed: template.labels.version=%s", version)
}

// kubectl runs kubectl against the test control plane; args after "--"
// are stdin.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	var stdin []byte
	if i := slices.Index(args, "--"); i >= 0 {
		stdin, args = []byte(strings.Join(args[i+1:], "\n")), args[:i]
	}
	out, err := env.Kubectl(t.Context(), stdin, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out
}

func getRollout(t *testing.T, ns string) *runtimev1alpha1.WorkloadGroupRollout {
	t.Helper()
	ro := &runtimev1alpha1.WorkloadGroupRollout{}
	must(t, env.Client.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "ratings"}, ro))
	return ro
}

func waitRollout(t *testing.T, ns, what string, cond func(*runtimev1alpha1.WorkloadGroupRollout) bool) *runtimev1alpha1.WorkloadGroupRollout {
	t.Helper()
	var ro *runtimev1alpha1.WorkloadGroupRollout
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, waitFor, true, func(context.Context) (bool, error) {
		ro = getRollout(t, ns)
		return cond(ro), nil
	})
	if err != nil {
		t.Fatalf("rollout: %s: %v; status %+v", what, err, ro.Status)
	}
	return ro
}

// complete: every workload has the group's generation gen.
func complete(ro *runtimev1alpha1.WorkloadGroupRollout, gen int64) bool {
	c := meta.FindStatusCondition(ro.Status.Conditions, runtimev1alpha1.RolloutConditionProgressing)
	return c != nil && c.Reason == runtimev1alpha1.ReasonRolloutComplete && c.ObservedGeneration == ro.Generation &&
		ro.Status.WorkloadGroupGeneration == gen && ro.Status.Updated == workloads && ro.Status.Total == workloads
}

func waitEvent(t *testing.T, ns, name, reason, contains string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		events := &corev1.EventList{}
		if err := env.Client.List(ctx, events, client.InNamespace(ns), client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("involvedObject.name", name)}); err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Reason == reason && e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, contains) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("no Warning %s Event on %s naming %q: %v", reason, name, contains, err)
	}
}

// timeline collects what happened, with the time since start.
type timeline struct {
	mu    sync.Mutex
	start time.Time
	lines []string
}

func (tl *timeline) note(format string, args ...any) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.lines = append(tl.lines, fmt.Sprintf("%7.2fs  ", time.Since(tl.start).Seconds())+fmt.Sprintf(format, args...))
}

// reset starts the timeline again (the fleet's start-up is not part of it).
func (tl *timeline) reset() {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.start, tl.lines = time.Now(), nil
}

func (tl *timeline) String() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return strings.Join(tl.lines, "\n")
}

// wstate is what the watch knows of one workload (one VM): its live
// registration, if any.
type wstate struct {
	name      string
	instance  string
	uid       types.UID
	present   bool
	connected bool
	healthy   bool
	version   string // template.labels.version of its WorkloadGroup snapshot
}

func (s wstate) ready() bool { return s.present && s.connected && s.healthy }

func (s wstate) String() string {
	switch {
	case !s.present:
		return "registration gone"
	case !s.connected:
		return "registered (" + s.version + "), sidecar not connected"
	case !s.healthy:
		return "connected (" + s.version + "), not healthy"
	default:
		return "connected and healthy (" + s.version + ")"
	}
}

// watcher follows the namespace's registrations and the rollout with
// watches, in order, and records each workload's changes in the timeline
// and, once measuring, the most workloads unavailable at once.
type watcher struct {
	tl         *timeline
	byInstance map[string]*fleetVM
	cancel     context.CancelFunc
	done       sync.WaitGroup

	mu        sync.Mutex
	changed   *sync.Cond
	state     map[string]wstate // by instance ID
	measuring bool
	maxDown   int // not ready: gone, disconnected or unhealthy
	maxGone   int // out of date and disconnected: gone or disconnected
	batch     int32
}

func newWatcher(t *testing.T, ns string, byInstance map[string]*fleetVM, tl *timeline) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	w := &watcher{tl: tl, byInstance: byInstance, cancel: cancel, state: map[string]wstate{}}
	w.changed = sync.NewCond(&w.mu)
	wars, err := env.Client.Watch(ctx, &runtimev1alpha1.WorkloadAutoRegistrationList{}, client.InNamespace(ns))
	must(t, err)
	ros, err := env.Client.Watch(ctx, &runtimev1alpha1.WorkloadGroupRolloutList{}, client.InNamespace(ns))
	must(t, err)
	w.done.Go(func() { w.follow(t, ctx, wars, w.registration) })
	w.done.Go(func() { w.follow(t, ctx, ros, w.rollout) })
	t.Cleanup(w.stop)
	return w
}

func (w *watcher) stop() {
	w.cancel()
	w.done.Wait()
	w.mu.Lock()
	w.changed.Broadcast()
	w.mu.Unlock()
}

func (w *watcher) follow(t *testing.T, ctx context.Context, wi watch.Interface, on func(watch.EventType, client.Object)) {
	defer wi.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-wi.ResultChan():
			if !ok {
				if ctx.Err() == nil {
					t.Errorf("watch ended early")
				}
				return
			}
			if obj, ok := ev.Object.(client.Object); ok && ev.Type != watch.Error && ev.Type != watch.Bookmark {
				on(ev.Type, obj)
			}
		}
	}
}

func (w *watcher) registration(typ watch.EventType, obj client.Object) {
	war, ok := obj.(*runtimev1alpha1.WorkloadAutoRegistration)
	if !ok || war.Spec.Identity.AWS == nil || war.Spec.Identity.AWS.EC2 == nil {
		return
	}
	inst := war.Spec.Identity.AWS.EC2.InstanceID
	v := w.byInstance[inst]
	if v == nil {
		return
	}
	s := wstate{name: war.Name, instance: inst}
	if typ != watch.Deleted && war.DeletionTimestamp == nil {
		s.present, s.uid = true, war.UID
		s.connected = meta.IsStatusConditionTrue(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected)
		s.healthy = meta.IsStatusConditionTrue(war.Status.Conditions, runtimev1alpha1.ConditionHealthy)
		if spec, err := registry.GroupSpec(war.Spec.WorkloadGroup); err == nil {
			s.version = spec.GetTemplate().GetLabels()["version"]
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	old, had := w.state[inst]
	if had && !s.present && !old.present {
		return
	}
	w.state[inst] = s
	if !had || old.String() != s.String() || old.uid != s.uid {
		w.tl.note("%s %s: %s", v.Name, s.name, s)
	}
	if w.measuring {
		down, gone := w.counts()
		w.maxDown, w.maxGone = max(w.maxDown, down), max(w.maxGone, gone)
	}
	w.changed.Broadcast()
}

// counts returns how many workloads are not ready, and how many have no
// connected registration.
func (w *watcher) counts() (down, gone int) {
	for inst := range w.byInstance {
		s := w.state[inst]
		if !s.ready() {
			down++
		}
		if !s.present || !s.connected {
			gone++
		}
	}
	return down, gone
}

func (w *watcher) rollout(_ watch.EventType, obj client.Object) {
	ro, ok := obj.(*runtimev1alpha1.WorkloadGroupRollout)
	if !ok || ro.Status.Batch == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if ro.Status.Batches == w.batch {
		return
	}
	w.batch = ro.Status.Batches
	var names []string
	for _, m := range ro.Status.Batch.Workloads {
		names = append(names, m.Name)
	}
	w.tl.note("batch %d started: %s (updated %d/%d)", ro.Status.Batch.Number, strings.Join(names, ", "), ro.Status.Updated, ro.Status.Total)
}

// measure starts counting unavailable workloads.
func (w *watcher) measure() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.measuring = true
}

func (w *watcher) most() (down, gone int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.maxDown, w.maxGone
}

func (w *watcher) snapshot() map[string]wstate {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]wstate, len(w.state))
	for k, v := range w.state {
		out[k] = v
	}
	return out
}

func (w *watcher) uids() map[string]types.UID {
	out := map[string]types.UID{}
	for inst, s := range w.snapshot() {
		out[inst] = s.uid
	}
	return out
}

// names returns the workloads ordered by registration name (the order in
// which the rollout takes them).
func (w *watcher) names() []wstate {
	var out []wstate
	for _, s := range w.snapshot() {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b wstate) int { return strings.Compare(a.name, b.name) })
	return out
}

// waitFor waits until cond holds for the watched state.
func (w *watcher) waitFor(t *testing.T, what string, cond func(map[string]wstate) bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	stop := context.AfterFunc(t.Context(), func() { w.mu.Lock(); w.changed.Broadcast(); w.mu.Unlock() })
	defer stop()
	timer := time.AfterFunc(waitFor, func() { w.mu.Lock(); w.changed.Broadcast(); w.mu.Unlock() })
	defer timer.Stop()
	w.mu.Lock()
	defer w.mu.Unlock()
	for !cond(w.state) {
		if time.Now().After(deadline) || t.Context().Err() != nil {
			var lines []string
			for _, s := range w.state {
				lines = append(lines, w.byInstance[s.instance].Name+" "+s.name+": "+s.String())
			}
			slices.Sort(lines)
			w.mu.Unlock()
			defer w.mu.Lock()
			t.Fatalf("%s: not within %v:\n%s", what, waitFor, strings.Join(lines, "\n"))
		}
		w.changed.Wait()
	}
}

// waitAll waits until every workload satisfies cond.
func (w *watcher) waitAll(t *testing.T, what string, cond func(wstate) bool) {
	t.Helper()
	w.waitFor(t, what, func(all map[string]wstate) bool {
		for inst := range w.byInstance {
			if s, ok := all[inst]; !ok || !cond(s) {
				return false
			}
		}
		return true
	})
}

func freePort(t *testing.T) int {
	t.Helper()
	return freeport.MustPort(t)
}

// writeServingCert writes a test CA (ca.crt) and a serving certificate
// for endpointHost signed by it.
func writeServingCert(t *testing.T, dir string) (certFile, keyFile, caFile string) {
	t.Helper()
	ca, err := fixtures.NewCA("rollout test CA")
	must(t, err)
	certFile, keyFile, err = ca.ServingCert(dir, endpointHost)
	must(t, err)
	caFile = filepath.Join(dir, "ca.crt")
	must(t, ca.WritePEM(caFile))
	return certFile, keyFile, caFile
}
