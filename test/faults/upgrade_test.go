//go:build faults

package faults

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/test/endpointproc"
	"github.com/embark-mesh/embark/test/testenv"
)

// previousRelease is the commit the upgrade test starts from: the last
// release's commit (the repository has no tags yet, so the release is named
// by its hash, the merge base of this tree's branch). A release sets it to
// its own commit once it is cut (docs/upgrade.md, "Upgrading with VMs
// connected"); CI's clone has the full history, so the commit is there.
const previousRelease = "80bbee141ee410ee2323aed598d35e869ae85c9c"

// previous is the previous release, extracted and built once per test
// binary (removed by TestMain).
var previous releaseOnce

type releaseOnce struct {
	once sync.Once
	dir  string
	rel  *endpointproc.Release
	err  error
}

// get extracts and builds previousRelease on first use.
func (r *releaseOnce) get(t *testing.T) *endpointproc.Release {
	t.Helper()
	r.once.Do(func() {
		if r.dir, r.err = os.MkdirTemp("", "embark-previous-release-"); r.err != nil {
			return
		}
		start := time.Now()
		r.rel, r.err = endpointproc.BuildRelease(t.Context(), previousRelease, r.dir)
		t.Logf("previous release %s extracted and built in %v", previousRelease[:12], time.Since(start).Round(time.Millisecond))
	})
	if r.err != nil {
		t.Fatalf("previous release: %v", r.err)
	}
	return r.rel
}

func (r *releaseOnce) remove() {
	if r.dir != "" {
		_ = os.RemoveAll(r.dir)
	}
}

// Embark rolled from the previous release to this tree with VMs connected,
// in docs/upgrade.md's order: the previous release's CRDs and two replicas
// of its endpoint hold the fleet's streams (half on each); this tree's CRDs
// are applied with the documented command while they run; then the
// Deployment rolls one replica at a time, each new replica started before
// the old one stops (old A,B -> new A, old B -> new A,B). Throughout: no
// registration deleted or created again (UIDs unchanged), no AgentConnected
// transition written (the registrations' AgentConnected status as a watch
// sees every write), every stream reconnected and stored on a running
// replica. While both versions run, a registration the new replica creates
// has its sidecar token renewed by the old replica and its stream served
// and stored by it; the old replica's registrations are served and stored by
// the new one.
func TestRollingUpgradeFromPreviousRelease(t *testing.T) {
	n := fleet(t)
	old := previous.get(t)
	ctx := t.Context()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	current := filepath.Join(root, "manifests", "charts", "embark", "crds")
	t.Cleanup(func() {
		// The package's other tests run against this tree's CRDs.
		if _, err := env.Kubectl(context.Background(), nil, "apply", "--server-side", "--force-conflicts", "-f", current); err != nil {
			t.Errorf("restore this tree's CRDs: %v", err)
		}
	})
	// The previous release's CRDs, as its step 1 applied them (by
	// kubectl's field manager, which the next step keeps).
	applyCRDs(t, old.CRDDir(), "--force-conflicts")

	f := newFixture(t, 0)
	f.neverDeleted = true
	oldC, newC := *f.cluster, *f.cluster
	oldC.Binary, newC.Binary = old.Binary, bin
	oldA, oldB := f.newReplica(&oldC, "embark-old-a"), f.newReplica(&oldC, "embark-old-b")
	newA, newB := f.newReplica(&newC, "embark-new-a"), f.newReplica(&newC, "embark-new-b")
	for _, r := range []*endpointproc.Replica{oldA, oldB} {
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// The fleet onboards through the previous release: registrations,
	// WorkloadEntries and sidecar credentials written by it. Each half
	// holds a stream to one old replica and, when that one stops, moves
	// to the new replica that replaced it (the Service's other endpoints).
	agents := f.onboard(oldA, n)
	half := n / 2
	onA, onB := agents[:half], agents[half:]
	hold(onA, f.conns(len(onA), oldA, newA, newB))
	hold(onB, f.conns(len(onB), oldB, newB, newA))
	took := f.expect(2*time.Minute, truthOf(all(onA, want{connected: true, replica: oldA.Name}), all(onB, want{connected: true, replica: oldB.Name})))
	t.Logf("%d agents onboarded by the previous release, connected and stored %v after onboarding", n, took)

	// Step 1 of docs/upgrade.md: this tree's CRDs, with the documented
	// command, while the previous release runs.
	applyCRDs(t, current)
	more := f.onboard(oldB, 2) // the previous release still onboards
	t.Cleanup(func() { disconnect(more) })
	watcher := watchTransitions(t, f.ns, n+len(more))

	// Step 2, first replica: new A starts, then old A stops (SIGTERM).
	roll := time.Now()
	rollReplica(t, oldA, newA)
	f.expect(time.Minute, truthOf(all(onA, want{connected: true, replica: newA.Name}), all(onB, want{connected: true, replica: oldB.Name}), all(more, want{connected: false})))
	t.Logf("old A -> new A: %d workloads onboarded by the previous release held and stored by new A %v after the roll began", len(onA), time.Since(roll).Round(time.Millisecond))

	// Both versions run: new A onboards; old B renews those sidecars'
	// tokens and serves and stores their streams.
	mixed := f.onboard(newA, max(2, n/100))
	renewAt(t, f, oldB, mixed)
	hold(mixed, f.conns(len(mixed), oldB, newB, newA))
	f.expect(time.Minute, truthOf(all(onA, want{connected: true, replica: newA.Name}), all(onB, want{connected: true, replica: oldB.Name}),
		all(mixed, want{connected: true, replica: oldB.Name}), all(more, want{connected: false})))
	t.Logf("%d registrations created by this tree: tokens renewed, streams served and stored by the previous release", len(mixed))

	// Step 2, second replica: new B starts, then old B stops.
	roll = time.Now()
	rollReplica(t, oldB, newB)
	onNewB := append(append([]*endpointproc.Agent{}, onB...), mixed...)
	f.expect(time.Minute, truthOf(all(onA, want{connected: true, replica: newA.Name}), all(onNewB, want{connected: true, replica: newB.Name}), all(more, want{connected: false})))
	t.Logf("old B -> new B: %d workloads held and stored by new B %v after the roll began", len(onNewB), time.Since(roll).Round(time.Millisecond))

	// Past the out-of-traffic delay of the stopped replicas: none of the
	// moved workloads left traffic.
	moved := append(append([]*endpointproc.Agent{}, onA...), onNewB...)
	f.noneOutOfTraffic(roll, moved)
	rolled := watcher.take(t)
	for _, a := range agents {
		if a.Connects() < 2 {
			t.Errorf("%s connected %d times, want a reconnect after its replica stopped", a.Registration, a.Connects())
		}
	}

	// The next roll, from this tree to this tree (a new version or a
	// configuration change): new A stops while new B runs; its workloads
	// move to new B and its shutdown hands them over (no disconnect
	// written, its Lease left to expire: Lifecycle.HandOver).
	roll = time.Now()
	if err := newA.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s stopped in %v", newA.Name, time.Since(roll).Round(time.Millisecond))
	f.expect(time.Minute, truthOf(all(moved, want{connected: true, replica: newB.Name}), all(more, want{connected: false})))
	t.Logf("new A stopped: %d workloads held and stored by new B %v after the SIGTERM", len(moved), time.Since(roll).Round(time.Millisecond))
	if flaps := watcher.take(t); len(flaps) > 0 {
		t.Errorf("AgentConnected transitions written while this tree's replica stopped (%d registrations):\n%s", len(flaps), summary(flaps))
	}
	switch {
	case len(rolled) == 0:
		t.Logf("no AgentConnected transition written for %d workloads through the roll", len(moved))
	case previousReleaseHandsOver:
		t.Errorf("AgentConnected transitions written during the roll (%d registrations):\n%s", len(rolled), summary(rolled))
	default:
		// The previous release's shutdown stores its workloads
		// disconnected at once: one False, then True again from the
		// replica they moved to, and nothing else.
		for _, line := range rolled {
			if !strings.HasSuffix(line, ": [False True]") {
				t.Errorf("transitions beyond the previous release's one disconnect at shutdown: %s", line)
			}
		}
		t.Logf("the previous release's shutdowns wrote AgentConnected False then True for %d of %d workloads (no handover before this tree)", len(rolled), len(moved))
	}
}

// previousReleaseHandsOver says whether previousRelease's endpoint hands its
// workloads over when it shuts down while another replica runs (no
// disconnect written, its Lease left to expire: Lifecycle.HandOver,
// Connections.HandOver): set it with the first previousRelease that has
// it, and the roll from it must write no AgentConnected transition at all.
const previousReleaseHandsOver = false

// summary is at most ten lines of lines.
func summary(lines []string) string {
	if len(lines) > 10 {
		lines = append(lines[:10:10], fmt.Sprintf("... and %d more", len(lines)-10))
	}
	return strings.Join(lines, "\n")
}

// applyCRDs applies the CRDs of dir with `kubectl apply --server-side`
// (docs/upgrade.md, step 1) and waits until the API server serves them.
func applyCRDs(t *testing.T, dir string, flags ...string) {
	t.Helper()
	out, err := env.Kubectl(t.Context(), nil, append([]string{"apply", "--server-side", "-f", dir}, flags...)...)
	if err != nil {
		t.Fatalf("apply the CRDs of %s: %v", dir, err)
	}
	t.Logf("applied %s: %s", dir, strings.TrimSpace(out))
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in %s (%v)", dir, err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		want := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(data, want); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		waitCRD(t, want)
	}
}

// waitCRD waits until the stored CRD has exactly want's versions (names,
// served and storage flags, schemas, columns) and is Established: the API
// server serves the CRDs just applied, not a merge with earlier ones.
func waitCRD(t *testing.T, want *apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := &apiextensionsv1.CustomResourceDefinition{}
		err := env.Client.Get(t.Context(), client.ObjectKey{Name: want.Name}, got)
		if err == nil && equality.Semantic.DeepEqual(got.Spec.Versions, want.Spec.Versions) && established(got) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRD %s not established with the applied versions after 30s: %v", want.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}

// rollReplica replaces from by to as a Deployment's rolling update does:
// to starts and is ready before from gets SIGTERM.
func rollReplica(t *testing.T, from, to *endpointproc.Replica) {
	t.Helper()
	start := time.Now()
	if err := to.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	ready := time.Since(start)
	if err := from.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s ready in %v; %s stopped in %v", to.Name, ready.Round(time.Millisecond), from.Name, (time.Since(start) - ready).Round(time.Millisecond))
}

// renewAt renews the agents' sidecar tokens through replica r.
func renewAt(t *testing.T, f *fixture, r *endpointproc.Replica, agents []*endpointproc.Agent) {
	t.Helper()
	conn, err := endpointproc.Dial(r.Onboarding)
	if err != nil {
		t.Fatal(err)
	}
	defer func(c *grpc.ClientConn) { _ = c.Close() }(conn)
	api := onboardingv1alpha1.NewOnboardingServiceClient(conn)
	for _, a := range agents {
		if err := a.RenewToken(t.Context(), api, f.ca, f.ns, endpointproc.Group); err != nil {
			t.Fatal(err)
		}
	}
}

// transitions counts the AgentConnected status changes written to the
// registrations of a namespace, as a watch of them sees every write.
type transitions struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	status map[string]metav1.ConditionStatus
	// changes lists, per registration, the statuses written after the
	// first one seen.
	changes map[string][]metav1.ConditionStatus
	err     error
}

// watchTransitions starts counting and returns once the watch has seen the
// n registrations of ns.
func watchTransitions(t *testing.T, ns string, n int) *transitions {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	w := &transitions{cancel: cancel, done: make(chan struct{}), status: map[string]metav1.ConditionStatus{}, changes: map[string][]metav1.ConditionStatus{}}
	go w.run(ctx, ns)
	t.Cleanup(func() { w.stop() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		w.mu.Lock()
		seen, err := len(w.status), w.err
		w.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if seen >= n {
			return w
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watch saw %d of %d registrations after 30s", seen, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// run watches from the current state, resuming at the last resource
// version when the watch ends; a watch that cannot resume is an error
// (writes would go uncounted).
func (w *transitions) run(ctx context.Context, ns string) {
	defer close(w.done)
	rv := ""
	for ctx.Err() == nil {
		opts := &client.ListOptions{Namespace: ns, Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}}
		wt, err := env.Client.Watch(ctx, &runtimev1alpha1.WorkloadAutoRegistrationList{}, opts)
		if err != nil {
			if ctx.Err() == nil {
				w.fail(fmt.Errorf("watch registrations: %w", err))
			}
			return
		}
		for ev := range wt.ResultChan() {
			if ev.Type == watch.Error {
				if ctx.Err() != nil {
					wt.Stop()
					return // stopped
				}
				w.fail(fmt.Errorf("watch registrations: %w", apierrors.FromObject(ev.Object)))
				wt.Stop()
				return
			}
			war, ok := ev.Object.(*runtimev1alpha1.WorkloadAutoRegistration)
			if !ok {
				continue
			}
			rv = war.ResourceVersion
			if ev.Type == watch.Added || ev.Type == watch.Modified {
				w.observe(war)
			}
		}
		wt.Stop()
	}
}

func (w *transitions) observe(war *runtimev1alpha1.WorkloadAutoRegistration) {
	var status metav1.ConditionStatus
	if c := meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected); c != nil {
		status = c.Status
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// A first condition (a registration's first connect) is no
	// transition; every later change of status is.
	if prev := w.status[war.Name]; prev != "" && prev != status {
		w.changes[war.Name] = append(w.changes[war.Name], status)
	}
	w.status[war.Name] = status
}

func (w *transitions) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

// take returns one line per registration whose AgentConnected status
// changed since the last take (sorted), and forgets them; a watch that
// failed fails the test.
func (w *transitions) take(t *testing.T) []string {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		t.Fatal(w.err)
	}
	var out []string
	for name, ch := range w.changes {
		out = append(out, fmt.Sprintf("%s: %v", name, ch))
	}
	sort.Strings(out)
	w.changes = map[string][]metav1.ConditionStatus{}
	return out
}

// stop ends the watch.
func (w *transitions) stop() {
	w.cancel()
	<-w.done
}
