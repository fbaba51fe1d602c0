//go:build faults

package faults

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/endpointproc"
	"github.com/embark-mesh/embark/test/testenv"
)

var (
	env *testenv.Env
	bin string
	// instances numbers simulated instances across the suite.
	instances atomic.Int64
)

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{Restartable: true}, &env, func(ctx context.Context) error {
		dir, err := os.MkdirTemp("", "embark-faults-")
		if err != nil {
			return err
		}
		bin, err = endpointproc.Build(ctx, dir)
		return err
	})
}

// outage is how long the API server stays down (FAULTS_APISERVER_OUTAGE,
// default 60s).
func outage(t *testing.T) time.Duration {
	if s := os.Getenv("FAULTS_APISERVER_OUTAGE"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("FAULTS_APISERVER_OUTAGE: %v", err)
		}
		return d
	}
	return 60 * time.Second
}

// fixture is one test's endpoint deployment: a namespace, replicas and
// agents.
type fixture struct {
	t        *testing.T
	ns       string
	ca       *awstest.CA
	cluster  *endpointproc.Cluster
	replicas []*endpointproc.Replica
}

func newFixture(t *testing.T, replicas int) *fixture {
	t.Helper()
	ctx := t.Context()
	ns := env.Namespace(t)
	if err := endpointproc.CreateFixture(ctx, env.Client, ns); err != nil {
		t.Fatal(err)
	}
	ca, err := awstest.NewCA("us-east-2")
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, ns: ns, ca: ca, cluster: &endpointproc.Cluster{Binary: bin, Kubeconfig: env.KubeconfigPath, Namespace: ns, CA: ca, Dir: t.TempDir()}}
	for i := range replicas {
		r, err := f.cluster.NewReplica(fmt.Sprintf("%s-%d", strings.ToLower(strings.TrimPrefix(t.Name(), "Test"))[:8], i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			r.Cleanup()
			if t.Failed() {
				t.Logf("replica %s log (end):\n%s", r.Name, r.LogTail())
			}
		})
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		f.replicas = append(f.replicas, r)
	}
	return f
}

func (f *fixture) conns(rs ...*endpointproc.Replica) []*grpc.ClientConn {
	var out []*grpc.ClientConn
	for _, r := range rs {
		c, err := endpointproc.Dial(r.XDS)
		if err != nil {
			f.t.Fatal(err)
		}
		f.t.Cleanup(func() { _ = c.Close() })
		out = append(out, c)
	}
	return out
}

// onboard onboards n new agents through replica r.
func (f *fixture) onboard(r *endpointproc.Replica, n int) []*endpointproc.Agent {
	f.t.Helper()
	conn, err := endpointproc.Dial(r.Onboarding)
	if err != nil {
		f.t.Fatal(err)
	}
	defer conn.Close()
	api := onboardingv1alpha1.NewOnboardingServiceClient(conn)
	var out []*endpointproc.Agent
	for range n {
		a := endpointproc.NewAgent(int(instances.Add(1)))
		if err := a.Onboard(f.t.Context(), api, f.ca, f.ns, endpointproc.Group); err != nil {
			f.t.Fatal(err)
		}
		f.t.Cleanup(a.Disconnect)
		out = append(out, a)
	}
	return out
}

func hold(agents []*endpointproc.Agent, conns []*grpc.ClientConn) {
	for _, a := range agents {
		a.Hold(conns)
	}
}

func disconnect(agents []*endpointproc.Agent) {
	for _, a := range agents {
		a.Disconnect()
	}
}

// want is the truth about one workload: whether its agent is connected, and
// (when connected and set) the replica that must hold it.
type want struct {
	connected bool
	replica   string
}

// expect waits until the stored state of the namespace is exactly truth:
// every registration present, not being deleted, with its WorkloadEntry,
// AgentConnected as the agent knows, and no other registration. It returns
// how long that took.
func (f *fixture) expect(timeout time.Duration, truth map[*endpointproc.Agent]want) time.Duration {
	f.t.Helper()
	start := time.Now()
	var problems []string
	for {
		problems = problems[:0]
		ws, err := endpointproc.Workloads(f.t.Context(), env.Client, f.ns)
		if err != nil {
			problems = append(problems, err.Error())
		}
		names := map[string]bool{}
		for a, w := range truth {
			names[a.Registration] = true
			got, ok := ws[a.Registration]
			switch {
			case !ok:
				problems = append(problems, a.Registration+": registration missing")
			case got.Deleting:
				problems = append(problems, a.Registration+": being deleted")
			case !got.WorkloadEntry:
				problems = append(problems, a.Registration+": WorkloadEntry missing")
			case w.connected && got.Connected != "True":
				problems = append(problems, fmt.Sprintf("%s: AgentConnected %q, want True (agent stream up: %v, last error %v)", a.Registration, got.Connected, a.Connected(), a.LastError()))
			case !w.connected && got.Connected != "False" && (a.Connects() > 0 || got.Connected != ""):
				// A workload whose agent never connected has no condition yet.
				problems = append(problems, fmt.Sprintf("%s: AgentConnected %q, want False", a.Registration, got.Connected))
			case w.connected && w.replica != "" && got.Replica != w.replica:
				problems = append(problems, fmt.Sprintf("%s: held by %q, want %q", a.Registration, got.Replica, w.replica))
			}
		}
		for name := range ws {
			if !names[name] {
				problems = append(problems, name+": unexpected registration")
			}
		}
		if len(problems) == 0 {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			sort.Strings(problems)
			if len(problems) > 10 {
				problems = append(problems[:10], fmt.Sprintf("... and %d more", len(problems)-10))
			}
			f.t.Fatalf("state differs from the truth after %v:\n%s", timeout, strings.Join(problems, "\n"))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func truthOf(groups ...map[*endpointproc.Agent]want) map[*endpointproc.Agent]want {
	out := map[*endpointproc.Agent]want{}
	for _, g := range groups {
		for a, w := range g {
			out[a] = w
		}
	}
	return out
}

func all(agents []*endpointproc.Agent, w want) map[*endpointproc.Agent]want {
	out := map[*endpointproc.Agent]want{}
	for _, a := range agents {
		out[a] = w
	}
	return out
}

// A graceful restart of the only replica: its streams close and are stored
// as disconnected, the registrations stay, and the agents reconnect to the
// restarted process.
func TestEndpointRestartKeepsRegistrations(t *testing.T) {
	f := newFixture(t, 1)
	r := f.replicas[0]
	agents := f.onboard(r, 20)
	hold(agents, f.conns(r))
	t.Logf("connected: %v", f.expect(2*time.Minute, all(agents, want{connected: true, replica: r.Name})))

	start := time.Now()
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped in %v", time.Since(start))
	// No replica runs: every stream closed and the shutdown stored it.
	t.Logf("disconnects stored %v after the stop", f.expect(30*time.Second, all(agents, want{connected: false})))

	start = time.Now()
	if err := r.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted in %v", time.Since(start))
	took := f.expect(2*time.Minute, all(agents, want{connected: true, replica: r.Name}))
	t.Logf("all %d agents reconnected and stored %v after the restart", len(agents), took)

	// The restarted endpoint onboards too.
	more := f.onboard(r, 1)
	f.expect(time.Minute, truthOf(all(agents, want{connected: true}), all(more, want{connected: false})))
}

// SIGKILL of the replica holding every stream while a second one runs: the
// agents reconnect to the survivor, which takes the workloads over; nothing
// is deleted.
func TestKillOfStreamOwnerHandsOver(t *testing.T) {
	f := newFixture(t, 2)
	owner, survivor := f.replicas[0], f.replicas[1]
	agents := f.onboard(owner, 20)
	hold(agents, f.conns(owner, survivor))
	f.expect(2*time.Minute, all(agents, want{connected: true, replica: owner.Name}))

	start := time.Now()
	if err := owner.Kill(); err != nil {
		t.Fatal(err)
	}
	took := f.expect(2*time.Minute, all(agents, want{connected: true, replica: survivor.Name}))
	t.Logf("all %d workloads held by the survivor %v after the SIGKILL (%v)", len(agents), took, time.Since(start))

	// A later disconnect is stored by the survivor.
	disconnect(agents[:5])
	f.expect(time.Minute, truthOf(all(agents[5:], want{connected: true, replica: survivor.Name}), all(agents[:5], want{connected: false})))
}

// The API server is down for 60 s while some agents disconnect and others
// connect: nothing is lost or deleted, and once it is back the stored state
// matches the truth.
func TestAPIServerOutage(t *testing.T) {
	f := newFixture(t, 1)
	r := f.replicas[0]
	conns := f.conns(r)
	leaving := f.onboard(r, 5)  // connected before, disconnect during the outage
	staying := f.onboard(r, 5)  // connected throughout
	arriving := f.onboard(r, 5) // disconnected before, connect during the outage
	hold(leaving, conns)
	hold(staying, conns)
	f.expect(2*time.Minute, truthOf(all(leaving, want{connected: true}), all(staying, want{connected: true}), all(arriving, want{connected: false})))

	down := outage(t)
	start := time.Now()
	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			_ = env.StartAPIServer()
		}
	}()
	t.Logf("kube-apiserver stopped in %v; down for %v", time.Since(start), down)
	start = time.Now()
	time.Sleep(down / 4)
	disconnect(leaving)
	hold(arriving, conns)
	time.Sleep(down - time.Since(start))
	start = time.Now()
	if err := env.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	t.Logf("kube-apiserver restarted in %v", time.Since(start))
	took := f.expect(3*time.Minute, truthOf(all(leaving, want{connected: false}), all(staying, want{connected: true, replica: r.Name}), all(arriving, want{connected: true, replica: r.Name})))
	t.Logf("state matches the truth %v after the API server came back", took)
}

// etcd restarts (10 s down) while agents disconnect: the stored state
// catches up and onboarding works again.
func TestEtcdRestart(t *testing.T) {
	f := newFixture(t, 1)
	r := f.replicas[0]
	conns := f.conns(r)
	agents := f.onboard(r, 10)
	hold(agents, conns)
	f.expect(2*time.Minute, all(agents, want{connected: true}))

	start := time.Now()
	if err := env.StopEtcd(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			_ = env.StartEtcd()
		}
	}()
	disconnect(agents[:3])
	time.Sleep(10*time.Second - time.Since(start))
	start = time.Now()
	if err := env.StartEtcd(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	t.Logf("etcd restarted in %v", time.Since(start))
	took := f.expect(3*time.Minute, truthOf(all(agents[:3], want{connected: false}), all(agents[3:], want{connected: true, replica: r.Name})))
	t.Logf("state matches the truth %v after etcd came back", took)
	more := f.onboard(r, 1)
	f.expect(time.Minute, truthOf(all(agents[:3], want{connected: false}), all(agents[3:], want{connected: true}), all(more, want{connected: false})))
}
