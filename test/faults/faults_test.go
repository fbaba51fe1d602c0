//go:build faults

package faults

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
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
	var dir string
	code := testenv.Run(m, testenv.Options{Restartable: true}, &env, func(ctx context.Context) error {
		if bin = os.Getenv("FAULTS_ENDPOINT_BINARY"); bin != "" {
			return nil // built from this tree beforehand (go build ./cmd/onboarding-endpoint)
		}
		var err error
		if dir, err = os.MkdirTemp("", "embark-faults-"); err != nil {
			return err
		}
		bin, err = endpointproc.Build(ctx, dir)
		return err
	})
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
	previous.remove()
	os.Exit(code)
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

// fleet is how many ADS streams each test holds (FAULTS_STREAMS; `make
// faults` runs 1,000; default 20 for a quick run by hand).
func fleet(t *testing.T) int {
	if s := os.Getenv("FAULTS_STREAMS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 10 {
			t.Fatalf("FAULTS_STREAMS=%q: want a number of streams, at least 10", s)
		}
		return n
	}
	return 20
}

// suiteConfig sets the replicas' configuration beyond the fixture's: every
// simulated VM connects from the same loopback address, so the per-source
// limits, sized for one host each, are raised to let 1,000 VMs' worth of
// connects and onboardings come from one source. The write budget is the
// default (registration.writeQPS / writeBurst, 400/s, burst 1,000), sized for
// 1,000 workloads per replica: a connect costs two writes (registration status
// and WorkloadEntry), a disconnect one (the status).
func suiteConfig(cfg *config.Configuration) {
	cfg.Limits.Onboarding.RequestsPerSecondPerSource = 100000
	cfg.Limits.Onboarding.RequestBurstPerSource = 100000
	cfg.Limits.XDS.RequestsPerSecondPerSource = 100000
	cfg.Limits.XDS.RequestBurstPerSource = 100000
	cfg.Limits.XDS.MaxConnectionsPerSource = 1000
	// No per-source limit on credential verifications: one source
	// onboards the whole fleet.
	cfg.Registration.VerifyPerSecond = -1
}

// fixture is one test's endpoint deployment: a namespace, replicas and
// agents.
type fixture struct {
	t        *testing.T
	ns       string
	ca       *awstest.CA
	cluster  *endpointproc.Cluster
	replicas []*endpointproc.Replica
	// uids are the registrations' UIDs from Register: another UID under a
	// name means the registration was deleted and created again.
	uids map[string]string
	// neverDeleted makes expect fail at once when a registration of the
	// truth is missing or being deleted (none may be, at any instant).
	neverDeleted bool
}

func newFixture(t *testing.T, replicas int) *fixture {
	t.Helper()
	return newFixtureWith(t, replicas, suiteConfig)
}

// newFixtureWith is newFixture with the replicas configured by configure
// (which should call suiteConfig).
func newFixtureWith(t *testing.T, replicas int, configure func(*config.Configuration)) *fixture {
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
	f := &fixture{t: t, ns: ns, ca: ca, uids: map[string]string{}, cluster: &endpointproc.Cluster{
		Binary: bin, Kubeconfig: env.KubeconfigPath, Namespace: ns, CA: ca, Dir: keepDir(t),
		Configure: configure,
	}}
	for i := range replicas {
		r := f.newReplica(f.cluster, fmt.Sprintf("%s-%d", strings.ToLower(strings.TrimPrefix(t.Name(), "Test"))[:8], i))
		if err := r.Start(ctx); err != nil {
			t.Fatal(err)
		}
		f.replicas = append(f.replicas, r)
	}
	return f
}

// newReplica configures a replica of cluster (not started) that the test
// stops at its end, showing its log's end when the test failed.
func (f *fixture) newReplica(c *endpointproc.Cluster, name string) *endpointproc.Replica {
	f.t.Helper()
	r, err := c.NewReplica(name)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		r.Cleanup()
		if f.t.Failed() {
			f.t.Logf("replica %s log (end):\n%s", r.Name, r.LogTail())
		}
	})
	return r
}

// conns dials per connections to each replica and returns, for the
// agent numbered i, the connections it tries in turn: one to each replica,
// in the order given. The server runs at most 100 streams per connection
// (limits.xds.maxConcurrentStreams), so the agents are spread over enough
// connections for all of them to be on one replica.
func (f *fixture) conns(agents int, rs ...*endpointproc.Replica) func(i int) []*grpc.ClientConn {
	per := max(1, (agents+49)/50)
	pools := make([][]*grpc.ClientConn, len(rs))
	for k, r := range rs {
		for range per {
			c, err := endpointproc.Dial(r.XDS)
			if err != nil {
				f.t.Fatal(err)
			}
			f.t.Cleanup(func() { _ = c.Close() })
			pools[k] = append(pools[k], c)
		}
	}
	return func(i int) []*grpc.ClientConn {
		out := make([]*grpc.ClientConn, len(pools))
		for k, p := range pools {
			out[k] = p[i%len(p)]
		}
		return out
	}
}

// onboard onboards n new agents through replica r, several at a time (the
// fast way to create n registrations: each goes through the real
// Authorize and Register, as an agent's does).
func (f *fixture) onboard(r *endpointproc.Replica, n int) []*endpointproc.Agent {
	f.t.Helper()
	conn, err := endpointproc.Dial(r.Onboarding)
	if err != nil {
		f.t.Fatal(err)
	}
	defer conn.Close()
	api := onboardingv1alpha1.NewOnboardingServiceClient(conn)
	start := time.Now()
	out := make([]*endpointproc.Agent, n)
	for i := range out {
		out[i] = endpointproc.NewAgent(int(instances.Add(1)))
		f.t.Cleanup(out[i].Disconnect)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  atomic.Int64
	)
	for range min(n, 16) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := out[i].Onboard(f.t.Context(), api, f.ca, f.ns, endpointproc.Group); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if first != nil {
		f.t.Fatal(first)
	}
	for _, a := range out {
		f.uids[a.Registration] = a.UID
	}
	if n >= 100 {
		f.t.Logf("onboarded %d agents in %v", n, time.Since(start).Round(time.Millisecond))
	}
	return out
}

// hold makes every agent hold a stream on the connections conns gives it.
func hold(agents []*endpointproc.Agent, conns func(int) []*grpc.ClientConn) {
	for i, a := range agents {
		a.Hold(conns(i))
	}
}

func disconnect(agents []*endpointproc.Agent) {
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Go(a.Disconnect)
	}
	wg.Wait()
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
			case ok && string(got.UID) != f.uids[a.Registration]:
				// Never right, whatever the wait: fail at once.
				f.t.Fatalf("%s was deleted and created again (UID %s, registered as %s)", a.Registration, got.UID, f.uids[a.Registration])
			case err == nil && (!ok || got.Deleting) && f.neverDeleted:
				f.t.Fatalf("%s deleted early (present %v, being deleted %v) %v into the wait", a.Registration, ok, got.Deleting, time.Since(start))
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

// noneOutOfTraffic waits until since + outOfTrafficAfter (10s, the
// replicas' default) + 5s, when any out-of-traffic timer started by
// what happened at since has fired, then fails the test if any WorkloadEntry
// of agents is missing or was taken out of traffic.
func (f *fixture) noneOutOfTraffic(since time.Time, agents []*endpointproc.Agent) {
	f.t.Helper()
	time.Sleep(time.Until(since.Add(config.DefaultOutOfTrafficAfter + 5*time.Second)))
	ws, err := endpointproc.Workloads(f.t.Context(), env.Client, f.ns)
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for _, a := range agents {
		if w, ok := ws[a.Registration]; !ok || !w.WorkloadEntry || w.OutOfTraffic {
			out = append(out, fmt.Sprintf("%s (registration %v, WorkloadEntry %v, out of traffic %v)", a.Registration, ok, w.WorkloadEntry, w.OutOfTraffic))
		}
	}
	if len(out) > 0 {
		sort.Strings(out)
		if len(out) > 10 {
			out = append(out[:10], fmt.Sprintf("... and %d more", len(out)-10))
		}
		f.t.Fatalf("%d of %d workloads left pods' endpoints:\n%s", len(out), len(agents), strings.Join(out, "\n"))
	}
	f.t.Logf("0 of %d workloads left traffic (%v after the fault)", len(agents), time.Since(since).Round(time.Second))
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

// A graceful restart of the only replica holding the fleet's streams: its
// streams close and are stored as disconnected, the registrations stay, and
// every agent reconnects to the restarted process, all stored within 30 s
// of the restart.
func TestEndpointRestartKeepsRegistrations(t *testing.T) {
	n := fleet(t)
	f := newFixture(t, 1)
	r := f.replicas[0]
	agents := f.onboard(r, n)
	f.neverDeleted = true
	hold(agents, f.conns(n, r))
	t.Logf("%d connected and stored in %v", n, f.expect(2*time.Minute, all(agents, want{connected: true, replica: r.Name})))

	start := time.Now()
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped in %v", time.Since(start))
	// No replica runs: every stream closed and the shutdown stored it.
	t.Logf("disconnects stored %v after the stop", f.expect(30*time.Second, all(agents, want{connected: false})))
	// A replica that shuts down takes no VM out of traffic, even when
	// the sidecars find no replica for longer than outOfTrafficAfter.
	f.noneOutOfTraffic(start, agents)

	start = time.Now()
	if err := r.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted in %v", time.Since(start))
	took := f.expect(30*time.Second, all(agents, want{connected: true, replica: r.Name}))
	t.Logf("all %d agents reconnected and stored %v after the restart (%v after the start)", len(agents), took, time.Since(start))

	// The restarted endpoint onboards too.
	more := f.onboard(r, 1)
	f.expect(time.Minute, truthOf(all(agents, want{connected: true}), all(more, want{connected: false})))
}

// SIGKILL of the replica holding half of the fleet's streams while a second
// one holds the other half: the killed replica's agents reconnect to the
// survivor, which takes their workloads over within 30 s; no registration
// is deleted or created again at any point.
func TestKillOfStreamOwnerHandsOver(t *testing.T) {
	n := fleet(t)
	f := newFixture(t, 2)
	owner, survivor := f.replicas[0], f.replicas[1]
	agents := f.onboard(owner, n)
	f.neverDeleted = true
	half := n / 2
	onOwner, onSurvivor := agents[:half], agents[half:]
	hold(onOwner, f.conns(half, owner, survivor))
	hold(onSurvivor, f.conns(n-half, survivor))
	f.expect(2*time.Minute, truthOf(all(onOwner, want{connected: true, replica: owner.Name}), all(onSurvivor, want{connected: true, replica: survivor.Name})))

	start := time.Now()
	if err := owner.Kill(); err != nil {
		t.Fatal(err)
	}
	took := f.expect(30*time.Second, all(agents, want{connected: true, replica: survivor.Name}))
	t.Logf("all %d workloads held by the survivor %v after the SIGKILL (%d moved; %v with the kill)", len(agents), took, len(onOwner), time.Since(start))
	// Neither the killed replica (nothing runs there) nor the survivor
	// (the moved workloads connected to it) takes a VM out of traffic.
	f.noneOutOfTraffic(start, agents)

	// A later disconnect is stored by the survivor.
	gone := onOwner[:5]
	disconnect(gone)
	f.neverDeleted = false
	f.expect(time.Minute, truthOf(all(agents[5:], want{connected: true, replica: survivor.Name}), all(gone, want{connected: false})))
}

// The API server is down for 60 s while a tenth of the fleet disconnects and
// another tenth connects: nothing is lost or deleted, and within 5 s of the
// API server's return the stored state matches the truth.
func TestAPIServerOutage(t *testing.T) {
	n := fleet(t)
	f := newFixture(t, 1)
	r := f.replicas[0]
	conns := f.conns(n, r)
	tenth := max(5, n/10)
	agents := f.onboard(r, n)
	leaving := agents[:tenth]           // connected before, disconnect during the outage
	arriving := agents[tenth : 2*tenth] // disconnected before, connect during the outage
	staying := agents[2*tenth:]         // connected throughout
	hold(leaving, conns)
	hold(staying, func(i int) []*grpc.ClientConn { return conns(tenth + i) })
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
	hold(arriving, func(i int) []*grpc.ClientConn { return conns(2*tenth + i) })
	time.Sleep(down - time.Since(start))
	start = time.Now()
	if err := env.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	restarted = true
	t.Logf("kube-apiserver restarted in %v", time.Since(start))
	// Every replica's Lease expired during the outage (nobody could renew
	// it): the sweeper must not take that for the replica being gone, and
	// the states held back must be stored as soon as the API server
	// answers, not after client-go's informer backoff (up to 60 s).
	f.neverDeleted = true
	took := f.expect(5*time.Second, truthOf(all(leaving, want{connected: false}), all(staying, want{connected: true, replica: r.Name}), all(arriving, want{connected: true, replica: r.Name})))
	t.Logf("state matches the truth %v after the API server came back (%d left, %d arrived, %d stayed)", took, len(leaving), len(arriving), len(staying))
}

// etcd restarts (10 s down) while agents disconnect: the stored state
// catches up and onboarding works again.
func TestEtcdRestart(t *testing.T) {
	f := newFixture(t, 1)
	r := f.replicas[0]
	agents := f.onboard(r, 10)
	hold(agents, f.conns(len(agents), r))
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

func keepDir(t *testing.T) string {
	if d := os.Getenv("FAULTS_KEEP_DIR"); d != "" {
		d = d + "/" + t.Name()
		_ = os.MkdirAll(d, 0o755)
		return d
	}
	return t.TempDir()
}
