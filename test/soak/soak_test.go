//go:build soak

package soak

import (
	"context"
	"fmt"
	"os"
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
	grace     = 15 * time.Second
	// tolerance of the flatness check, as a fraction of the mean.
	tolerance = 0.10
)

type sample struct {
	at                  time.Duration
	heapMiB, goroutines float64
	onboarded, swept    int
	registrations       int
}

func TestSoak(t *testing.T) {
	duration := 10 * time.Minute
	if s := os.Getenv("SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("SOAK_DURATION: %v", err)
		}
		duration = d
	}
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
	cluster := &endpointproc.Cluster{Binary: bin, Kubeconfig: env.KubeconfigPath, Namespace: ns, CA: ca, GracePeriod: grace, Dir: t.TempDir()}
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
	for n := 1; time.Since(start) < duration; n++ {
		<-tick.C
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
			m, err := r.Scrape("go_memstats_heap_inuse_bytes", "go_goroutines")
			if err != nil {
				t.Fatal(err)
			}
			ws, err := endpointproc.Workloads(ctx, env.Client, ns)
			if err != nil {
				t.Fatal(err)
			}
			s := sample{at: now.Sub(start), heapMiB: m["go_memstats_heap_inuse_bytes"] / (1 << 20), goroutines: m["go_goroutines"],
				onboarded: onboarded, registrations: len(ws)}
			s.swept = onboarded - len(ws)
			samples = append(samples, s)
			t.Logf("t=%-6s heap %6.1f MiB  goroutines %5.0f  onboarded %5d  registrations %4d  swept %5d",
				s.at.Round(time.Second), s.heapMiB, s.goroutines, s.onboarded, s.registrations, s.swept)
		}
	}

	// The held agents are still connected and registered.
	time.Sleep(2 * time.Second)
	ws, err := endpointproc.Workloads(ctx, env.Client, ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range held {
		if w, ok := ws[a.Registration]; !ok || w.Connected != "True" || !w.WorkloadEntry {
			t.Errorf("held agent %s: registration %+v (present %v), stream connected %v, last error %v", a.Registration, w, ok, a.Connected(), a.LastError())
		}
	}

	if t.Failed() {
		t.Logf("endpoint log:\n%s", r.LogTail())
	}

	// Flatness: skip the warm-up (the first fifth, while the first
	// connected agents and the first sweeps build up).
	warm := len(samples) / 5
	var xs, heap, gor []float64
	for _, s := range samples[warm:] {
		xs = append(xs, s.at.Minutes())
		heap = append(heap, s.heapMiB)
		gor = append(gor, s.goroutines)
	}
	if len(xs) < 5 {
		t.Fatalf("%d samples after the warm-up: too few to tell a trend (SOAK_DURATION of at least 2m)", len(xs))
	}
	var report strings.Builder
	fmt.Fprintf(&report, "soak %v: %d onboardings (%d/s target, %d held, grace %v), %d failed; %d samples, warm-up %d\n",
		duration, onboarded, rate, connected, grace, failures, len(samples), warm)
	for _, c := range []struct {
		name string
		ys   []float64
	}{{"heap in use (MiB)", heap}, {"goroutines", gor}} {
		tr := Fit(xs, c.ys)
		verdict := "flat"
		if !tr.Flat(tolerance) {
			verdict = "GROWING"
			t.Errorf("%s grows: %+v", c.name, tr)
		}
		fmt.Fprintf(&report, "%-18s mean %8.1f  slope %+7.2f/min  change over window %+7.1f  noise (residual sd) %6.1f  -> %s\n",
			c.name, tr.Mean, tr.Slope, tr.Change, tr.Noise, verdict)
	}
	t.Log("\n" + report.String())
}
