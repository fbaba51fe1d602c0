//go:build soak

package soak

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/endpointproc"
	"github.com/embark-mesh/embark/test/testenv"
)

var env *testenv.Env

// The garbage collector removes a swept registration's WorkloadEntry and
// sidecar Secret, as in a cluster, so nothing piles up.
func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{GarbageCollector: true}, &env) }

const (
	// rate of onboardings per second, and the number of agents kept
	// connected; older ones disconnect and are swept after the grace period.
	rate      = 2
	connected = 50
	// maxGrace and minGrace bound the grace period (graceFor): it outlasts
	// the replica's roll (SIGTERM, start, ready: about 3 s on a busy
	// machine), so that the held agents' registrations survive it.
	maxGrace = time.Minute
	minGrace = 20 * time.Second
	// eventCacheSize bounds the event correlator's LRU caches (client-go's
	// default 4096 entries each, about 5 entries per workload: Registered
	// and GracePeriodExpired events) so that they are full before the
	// warm-up ends; with the default they would fill for 20-40 minutes and
	// look like a leak of a few KiB per workload.
	eventCacheSize = 64
	// tolerance of the flatness check, as a fraction of the mean.
	tolerance = 0.10
)

type sample struct {
	at time.Duration
	// afterRoll says the sample was taken after the replica's roll.
	afterRoll bool
	// heapMiB is the live heap of a full collection (what is retained);
	// heapBeforeGCMiB the heap in use before it (with garbage, for the log).
	heapMiB, heapBeforeGCMiB, goroutines float64
	onboarded, swept                     int
	registrations                        int
}

func TestSoak(t *testing.T) {
	duration := soakDuration(t)
	grace := graceFor(duration)
	every := max(duration/20, 5*time.Second)
	ctx := t.Context()
	ns := env.Namespace(t)
	if err := endpointproc.CreateFixture(ctx, env.Client, ns); err != nil {
		t.Fatal(err)
	}
	bin, err := endpointproc.Build(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ca, err := awstest.NewCA("us-east-2")
	if err != nil {
		t.Fatal(err)
	}
	// Every sample takes a heap profile of the endpoint (its loopback
	// -pprof listener), which runs a full garbage collection first; then
	// go_gc_heap_live_bytes (the heap that collection kept) is read, so that
	// the check measures what is retained rather than how far the collector
	// let garbage pile up (go_memstats_heap_inuse_bytes, logged as "before").
	// SOAK_PROFILE_DIR keeps the profiles (heap-<n>.pb.gz) for
	// `go tool pprof -base`.
	profileDir := os.Getenv("SOAK_PROFILE_DIR")
	if profileDir == "" {
		profileDir = t.TempDir()
	}
	cluster := &endpointproc.Cluster{Binary: bin, Kubeconfig: env.KubeconfigPath, Namespace: ns, CA: ca, GracePeriod: grace, Dir: t.TempDir(),
		Pprof: true, EventCacheSize: eventCacheSize}
	r, err := cluster.NewReplica("soak-0")
	if err != nil {
		t.Fatal(err)
	}
	r.Register(t)
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	apiConn, err := endpointproc.Dial(r.Onboarding)
	if err != nil {
		t.Fatal(err)
	}
	defer apiConn.Close()
	xdsConn, err := endpointproc.Dial(r.XDS)
	if err != nil {
		t.Fatal(err)
	}
	defer xdsConn.Close()
	api := onboardingv1alpha1.NewOnboardingServiceClient(apiConn)

	var held []*endpointproc.Agent
	defer func() {
		for _, a := range held {
			a.Disconnect()
		}
	}()
	var samples []sample
	start := time.Now()
	onboarded, failures := 0, 0
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	nextSample := start
	// The replica is rolled once, at the end of the first fifth (the
	// warm-up), as a rolling update does: SIGTERM, then the same replica
	// started again; the held agents reconnect to it.
	rollAt, rolled := duration/5, false
	var rollTook time.Duration
	rollHeld, rollLost := 0, 0
	for n := 1; time.Since(start) < duration; n++ {
		<-tick.C
		if !rolled && time.Since(start) >= rollAt {
			rolled = true
			rollStart := time.Now()
			if err := r.Stop(); err != nil {
				t.Fatalf("roll: stop: %v", err)
			}
			if err := r.Start(ctx); err != nil {
				t.Fatalf("roll: start: %v", err)
			}
			rollTook = time.Since(rollStart)
			rollHeld, rollLost = checkRoll(ctx, t, ns, held, grace)
			t.Logf("t=%-6s replica rolled (stopped and ready again in %v): %d held agents reconnected, %d registrations lost or re-created",
				time.Since(start).Round(time.Second), rollTook.Round(100*time.Millisecond), rollHeld, rollLost)
			continue
		}
		a := endpointproc.NewAgent(n)
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := a.Onboard(octx, api, ca, ns, endpointproc.Group)
		cancel()
		if err != nil {
			failures++
			t.Logf("onboarding %d: %v", n, err)
			if failures > 10 {
				t.Fatalf("%d onboardings failed", failures)
			}
			continue
		}
		onboarded++
		a.Hold([]*grpc.ClientConn{xdsConn})
		held = append(held, a)
		if len(held) > connected {
			held[0].Disconnect()
			held = held[1:]
		}
		if now := time.Now(); !now.Before(nextSample) {
			nextSample = now.Add(every)
			before, err := r.Scrape("go_memstats_heap_inuse_bytes")
			if err != nil {
				t.Fatal(err)
			}
			if err := r.HeapProfile(filepath.Join(profileDir, fmt.Sprintf("heap-%02d.pb.gz", len(samples)+1))); err != nil {
				t.Fatal(err)
			}
			m, err := r.Scrape("go_gc_heap_live_bytes", "go_goroutines")
			if err != nil {
				t.Fatal(err)
			}
			ws, err := endpointproc.Workloads(ctx, env.Client, ns)
			if err != nil {
				t.Fatal(err)
			}
			s := sample{at: now.Sub(start), afterRoll: rolled, heapMiB: m["go_gc_heap_live_bytes"] / (1 << 20), goroutines: m["go_goroutines"],
				heapBeforeGCMiB: before["go_memstats_heap_inuse_bytes"] / (1 << 20),
				onboarded:       onboarded, registrations: len(ws)}
			s.swept = onboarded - len(ws)
			samples = append(samples, s)
			t.Logf("t=%-6s live heap %6.1f MiB (in use before GC %6.1f)  goroutines %5.0f  onboarded %5d  registrations %4d  swept %5d",
				s.at.Round(time.Second), s.heapMiB, s.heapBeforeGCMiB, s.goroutines, s.onboarded, s.registrations, s.swept)
		}
	}

	// The held agents are still connected and registered.
	time.Sleep(2 * time.Second)
	ws, err := endpointproc.Workloads(ctx, env.Client, ns)
	if err != nil {
		t.Fatal(err)
	}
	lost := 0
	for _, a := range held {
		if w, ok := ws[a.Registration]; !ok || w.Connected != "True" || !w.WorkloadEntry || string(w.UID) != a.UID {
			lost++
			t.Errorf("held agent %s (UID %s): registration %+v (present %v), stream connected %v, last error %v", a.Registration, a.UID, w, ok, a.Connected(), a.LastError())
		}
	}

	if t.Failed() {
		t.Logf("endpoint log:\n%s", r.LogTail())
	}

	// Flatness: skip the warm-up and the roll (the first fifth), and as
	// long again after the roll while the restarted replica's caches, held
	// streams and first sweeps build up again.
	warm := 0
	for warm < len(samples) && (!samples[warm].afterRoll || samples[warm].at < 2*rollAt) {
		warm++
	}
	var xs, heap, inuse, gor []float64
	for _, s := range samples[warm:] {
		xs = append(xs, s.at.Minutes())
		heap = append(heap, s.heapMiB)
		inuse = append(inuse, s.heapBeforeGCMiB)
		gor = append(gor, s.goroutines)
	}
	if len(xs) < 5 {
		t.Fatalf("%d samples after the warm-up: too few to tell a trend (SOAK_DURATION of at least 2m)", len(xs))
	}
	var report strings.Builder
	fmt.Fprintf(&report, "soak %v: %d onboardings (%d/s target, %d held, grace %v), %d failed; %d samples, warm-up and roll %d\n",
		duration, onboarded, rate, connected, grace, failures, len(samples), warm)
	fmt.Fprintf(&report, "replica rolled at %v (down and ready again in %v): %d held agents reconnected, %d registrations lost or re-created; at the end %d held, %d lost or re-created\n",
		rollAt, rollTook.Round(100*time.Millisecond), rollHeld, rollLost, len(held), lost)
	checkTrends(t, &report, xs, heap, gor, inuse)
	t.Log("\n" + report.String())
}

// soakDuration is SOAK_DURATION (default 10m): how long each soak runs.
func soakDuration(t *testing.T) time.Duration {
	t.Helper()
	s := os.Getenv("SOAK_DURATION")
	if s == "" {
		return 10 * time.Minute
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("SOAK_DURATION: %v", err)
	}
	return d
}

// graceFor is the grace period of a soak of duration d: a fifth of it
// between minGrace and maxGrace, so that in a short run (CI's soak-short)
// disconnected registrations are swept, and the number of registrations
// steady, before the flatness window starts (2 × the roll's time, also a
// fifth); with a fixed minute a 75 s run only ever grew.
func graceFor(d time.Duration) time.Duration { return min(maxGrace, max(minGrace, d/5)) }

// checkRoll waits (up to the grace period) for every agent held through
// the replica's roll to be connected again on a new stream, then checks
// that each one's registration is the one it registered (same UID),
// connected, with its WorkloadEntry. It returns how many reconnected and
// how many registrations were lost or re-created (each an error).
func checkRoll(ctx context.Context, t *testing.T, ns string, held []*endpointproc.Agent, grace time.Duration) (reconnected, lost int) {
	t.Helper()
	deadline := time.Now().Add(grace)
	for {
		reconnected = 0
		for _, a := range held {
			if a.Connected() && a.Connects() > 1 {
				reconnected++
			}
		}
		if reconnected == len(held) || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if reconnected != len(held) {
		t.Errorf("after the roll, %d of %d held agents reconnected within %v", reconnected, len(held), grace)
	}
	// The restarted replica writes AgentConnected again after the
	// reconnects; a second is enough on an idle machine, the poll is for a
	// busy one.
	for {
		ws, err := endpointproc.Workloads(ctx, env.Client, ns)
		if err != nil {
			t.Fatal(err)
		}
		lost = 0
		var bad []string
		for _, a := range held {
			if w, ok := ws[a.Registration]; !ok || w.Connected != "True" || !w.WorkloadEntry || string(w.UID) != a.UID {
				lost++
				bad = append(bad, fmt.Sprintf("%s (UID %s): %+v (present %v)", a.Registration, a.UID, w, ok))
			}
		}
		if lost == 0 || time.Now().After(deadline) {
			for _, b := range bad {
				t.Errorf("after the roll, registration %s", b)
			}
			return reconnected, lost
		}
		time.Sleep(time.Second)
	}
}

// checkTrends fits the samples taken at xs (minutes) and fails the test
// when the live heap or the goroutines grow beyond tolerance; it writes
// each trend to report, with the heap in use, which follows the
// collector's pacing (up to twice the live heap with GOGC=100), not what
// is retained: shown, not checked.
func checkTrends(t *testing.T, report *strings.Builder, xs, heap, gor, inuse []float64) {
	t.Helper()
	for _, c := range []struct {
		name string
		ys   []float64
	}{{"live heap (MiB)", heap}, {"goroutines", gor}} {
		tr := Fit(xs, c.ys)
		verdict := "flat"
		if !tr.Flat(tolerance) {
			verdict = "GROWING"
			t.Errorf("%s grows: %+v", c.name, tr)
		}
		fmt.Fprintf(report, "%-18s mean %8.1f  slope %+7.2f/min  change over window %+7.1f  noise (residual sd) %6.1f  -> %s\n",
			c.name, tr.Mean, tr.Slope, tr.Change, tr.Noise, verdict)
	}
	tr := Fit(xs, inuse)
	fmt.Fprintf(report, "%-18s mean %8.1f  slope %+7.2f/min  change over window %+7.1f  noise (residual sd) %6.1f  (not checked)\n",
		"heap in use (MiB)", tr.Mean, tr.Slope, tr.Change, tr.Noise)
}
