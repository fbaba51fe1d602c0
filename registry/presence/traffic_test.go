package presence

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/fixtures"
)

// testOutOfTrafficAfter is the out-of-traffic delay of these tests (the
// default is 10s).
const testOutOfTrafficAfter = 500 * time.Millisecond

// trafficHarness is a registered workload, of a group with or without a
// probe, connected to replica-a (whose API calls are counted), with a
// health mirror.
type trafficHarness struct {
	w       registry.StreamWorkload
	cc      *countingClient
	conns   *Connections
	mirror  *HealthMirror
	metrics *ConnectionMetrics
}

var trafficHosts atomic.Int32

func startTraffic(t *testing.T, probe bool) *trafficHarness {
	t.Helper()
	return startTrafficAfter(t, probe, testOutOfTrafficAfter)
}

// startTrafficAfter is startTraffic with the out-of-traffic delay.
func startTrafficAfter(t *testing.T, probe bool, delay time.Duration) *trafficHarness {
	t.Helper()
	ns := env.Namespace(t)
	wg := fixtures.SeedGroup(ns)
	if probe {
		wg.Spec.Probe = &istioapi.ReadinessProbe{
			PeriodSeconds: 1, FailureThreshold: 1, SuccessThreshold: 1,
			HealthCheckMethod: &istioapi.ReadinessProbe_HttpGet{HttpGet: &istioapi.HTTPHealthCheckConfig{Path: "/ready", Port: 8080}},
		}
	}
	fixtures.CreateGroup(t.Context(), t, env.Client, wg)
	n := trafficHosts.Add(1)
	res, err := newRegistrar(t, nil).Write(t.Context(), registry.Request{
		Group: wg, Identity: fixtures.AWSIdentity(fmt.Sprintf("i-0000000000000a%03d", n)), Registration: fixtures.Registration(fmt.Sprintf("172.31.10.%d", n)),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := &trafficHarness{w: registry.StreamWorkload{Key: client.ObjectKeyFromObject(res.Registration), UID: res.Registration.UID, Group: wg.Name}, cc: newCountingClient()}
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	if h.metrics, err = NewConnectionMetrics(prometheus.NewRegistry()); err != nil {
		t.Fatal(err)
	}
	h.conns, err = NewConnections(ctx, ConnectionOptions{
		Client: h.cc, Cache: cached, Replica: "replica-a", Logger: log, Metrics: h.metrics,
		DisconnectDelay: -1, OutOfTrafficAfter: delay,
	})
	if err != nil {
		t.Fatal(err)
	}
	h.mirror, err = NewHealthMirror(ctx, HealthOptions{
		Client: env.Client, Connections: h.conns, Damping: -1, Logger: log,
		Retry: wait.Backoff{Duration: 20 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: 200 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		h.conns.Wait()
		h.mirror.Wait()
	})
	h.conns.Opened(h.w, 1)
	waitObserved(t, h.w.Key, connectedTo("replica-a"))
	if probe {
		h.report(t, true)
	}
	if !routed(entry(t, h.w.Key)) {
		t.Fatal("a connected workload is not in traffic")
	}
	h.settle(t)
	return h
}

// report sends a health report and waits until the WorkloadEntry shows
// it (the registration's condition keeps its transition time when its
// status does not change: it is not taken out of traffic).
func (h *trafficHarness) report(t *testing.T, healthy bool) {
	t.Helper()
	at := time.Now().UTC().Truncate(time.Millisecond)
	h.mirror.ReportHealth(t.Context(), h.w, registry.HealthReport{Healthy: healthy, At: at})
	fixtures.Eventually(t, 30*time.Second, "the report stored", func() bool {
		c := registry.IstioCondition(entry(t, h.w.Key).Status.Conditions, registry.ConditionHealthy)
		return c.GetLastProbeTime().AsTime().Equal(at)
	})
}

// settle waits for every pending state and for the cache to show the
// stored registration and entry (a lagging cache's copy would cost a
// conflicting write more), and returns the API writes so far, forgetting
// them.
func (h *trafficHarness) settle(t *testing.T) map[string]int {
	t.Helper()
	if err := h.conns.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := h.mirror.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	fixtures.Eventually(t, 30*time.Second, "the cache in sync", func() bool {
		for _, obj := range []func() client.Object{
			func() client.Object { return &runtimev1alpha1.WorkloadAutoRegistration{} },
			func() client.Object { return &istionetworkingv1.WorkloadEntry{} },
		} {
			live, seen := obj(), obj()
			if env.Client.Get(t.Context(), h.w.Key, live) != nil || cached.Get(t.Context(), h.w.Key, seen) != nil ||
				live.GetResourceVersion() != seen.GetResourceVersion() {
				return false
			}
		}
		return true
	})
	return writes(h.cc.take())
}

func (h *trafficHarness) tookOut() float64 { return testutil.ToFloat64(h.metrics.outOfTraffic) }

func entry(t *testing.T, key types.NamespacedName) *istionetworkingv1.WorkloadEntry {
	t.Helper()
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(t.Context(), key, we); err != nil {
		t.Fatal(err)
	}
	return we
}

// routed reports whether istiod sends we to pods, as istiod decides it
// (pilot/pkg/serviceregistry/serviceentry isHealthy): always without
// proxy.istio.io/health-checks-enabled, else only while the Healthy
// condition is True.
func routed(we *istionetworkingv1.WorkloadEntry) bool {
	if on, err := strconv.ParseBool(we.Annotations[registry.AnnotationHealthChecksEnabled]); err != nil || !on {
		return true
	}
	c := registry.IstioCondition(we.Status.Conditions, registry.ConditionHealthy)
	return c != nil && c.GetStatus() == string(metav1.ConditionTrue)
}

// A workload whose last stream closed and that does not come back within
// the delay is taken out of traffic with one write to its WorkloadEntry
// (groups with and without a probe), its registration kept; a late report
// of the closed stream does not put it back; a reconnect does, the
// probe-less entry with no write beyond the connect's own.
func TestDisconnectedWorkloadLeavesTrafficAndComesBack(t *testing.T) {
	tests := []struct {
		name  string
		probe bool
		// wantOut are the API writes of the disconnect and of taking the
		// entry out: the registration's status, then the entry's
		// annotations (no probe) or its Healthy condition (probe).
		wantOut map[string]int
	}{
		{name: "no probe", wantOut: map[string]int{"status": 1, "entry": 1}},
		{name: "probe", probe: true, wantOut: map[string]int{"status": 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := startTraffic(t, tt.probe)
			h.conns.Closed(h.w, 1)
			fixtures.Eventually(t, 30*time.Second, "the entry out of traffic", func() bool { return !routed(entry(t, h.w.Key)) })
			wrote := h.settle(t)
			waitObserved(t, h.w.Key, disconnectedFrom("replica-a")) // the registration lives
			we := entry(t, h.w.Key)
			if tt.probe {
				c := registry.IstioCondition(we.Status.Conditions, registry.ConditionHealthy)
				if c.GetReason() != runtimev1alpha1.ReasonAgentDisconnected {
					t.Errorf("Healthy reason = %q, want %q", c.GetReason(), runtimev1alpha1.ReasonAgentDisconnected)
				}
			} else if we.Annotations[registry.AnnotationOutOfTraffic] != runtimev1alpha1.ReasonAgentDisconnected {
				t.Errorf("annotations = %v, want %s", we.Annotations, registry.AnnotationOutOfTraffic)
			}
			if got := wrote; !equalCounts(got, tt.wantOut) {
				t.Errorf("disconnect and out of traffic wrote %v, want %v", got, tt.wantOut)
			}
			if got := h.tookOut(); got != 1 {
				t.Errorf("out-of-traffic count = %v, want 1", got)
			}

			// A report of the closed stream (held or retried) is not
			// stored over it.
			h.mirror.ReportHealth(t.Context(), h.w, registry.HealthReport{Healthy: true, At: time.Now()})
			if err := h.mirror.Flush(t.Context()); err != nil {
				t.Fatal(err)
			}
			if routed(entry(t, h.w.Key)) {
				t.Fatal("a late report of the closed stream put the workload back in traffic")
			}
			h.settle(t)

			// The sidecar reconnects, without onboarding again.
			h.conns.Opened(h.w, 2)
			waitObserved(t, h.w.Key, connectedTo("replica-a"))
			if tt.probe {
				h.report(t, true) // the sidecar resends its probe's verdict on every new stream
			}
			fixtures.Eventually(t, 30*time.Second, "the entry back in traffic", func() bool { return routed(entry(t, h.w.Key)) })
			wrote = h.settle(t)
			we = entry(t, h.w.Key)
			if _, ok := we.Annotations[registry.AnnotationOutOfTraffic]; ok {
				t.Errorf("annotations after the reconnect = %v, want no %s", we.Annotations, registry.AnnotationOutOfTraffic)
			}
			// The connect's own writes only: the registration's status
			// and the entry's connection annotations (which also remove
			// the out-of-traffic mark; skipped when nothing changes, a
			// reconnect in the same second with a probe); the probe's
			// report is the mirror's, not counted.
			if got := wrote; got["status"] != 1 || got["entry"] > 1 || len(got) > 2 {
				t.Errorf("the reconnect wrote %v, want the connect's status write and at most one entry write", got)
			}
			if got := h.conns.pendingOutOfTraffic(); got != 0 {
				t.Errorf("pending out-of-traffic timers = %d, want 0", got)
			}
		})
	}
}

// A workload that comes back within the delay, to this replica or another,
// is never taken out of traffic: no WorkloadEntry write but the connect's.
func TestReconnectWithinTheDelayTakesNothingOut(t *testing.T) {
	tests := []struct {
		name    string
		replica string
	}{
		{name: "same replica", replica: "replica-a"},
		{name: "another replica", replica: "replica-b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Long enough for the other replica's connect to be stored
			// first on a loaded machine.
			const delay = 3 * time.Second
			h := startTrafficAfter(t, false, delay)
			other := h.conns
			if tt.replica != "replica-a" {
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				other = newConnections(t, ctx, tt.replica, nil)
				defer other.Wait()
			}
			h.conns.Closed(h.w, 1)
			if err := h.conns.Flush(t.Context()); err != nil { // the disconnect stored: its timer runs
				t.Fatal(err)
			}
			other.Opened(h.w, 2)
			waitObserved(t, h.w.Key, connectedTo(tt.replica))
			// Past the delay: the timer, if any is left, has fired.
			time.Sleep(2 * delay)
			h.settle(t)
			if we := entry(t, h.w.Key); !routed(we) || we.Annotations[registry.AnnotationOutOfTraffic] != "" {
				t.Errorf("entry after a reconnect within the delay: routed %v, annotations %v", routed(we), we.Annotations)
			}
			if got := h.tookOut(); got != 0 {
				t.Errorf("out-of-traffic count = %v, want 0", got)
			}
			if got := h.conns.pendingOutOfTraffic(); got != 0 {
				t.Errorf("pending out-of-traffic timers = %d, want 0", got)
			}
		})
	}
}

// A replica that shuts down closes its streams itself: their sidecars
// reconnect to another replica, so it takes none of them out of traffic,
// and the timers pending when it begins to drain stop.
func TestDrainingReplicaTakesNothingOut(t *testing.T) {
	const delay = 2 * time.Second // long enough for the timer to be seen pending
	h := startTrafficAfter(t, false, delay)
	pending := startTrafficAfter(t, false, delay)
	pending.conns.Closed(pending.w, 1)
	if err := pending.conns.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := pending.conns.pendingOutOfTraffic(); got != 1 {
		t.Fatalf("pending timers after a stored disconnect = %d, want 1", got)
	}
	pending.conns.Drain()
	if got := pending.conns.pendingOutOfTraffic(); got != 0 {
		t.Errorf("pending timers after Drain = %d, want 0", got)
	}

	h.conns.Drain()
	h.conns.Closed(h.w, 1)
	if err := h.conns.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitObserved(t, h.w.Key, disconnectedFrom("replica-a"))
	if got := h.conns.pendingOutOfTraffic(); got != 0 {
		t.Errorf("a draining replica started %d out-of-traffic timers, want 0", got)
	}
	time.Sleep(delay + time.Second)
	for _, x := range []*trafficHarness{h, pending} {
		if err := x.conns.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
		if we := entry(t, x.w.Key); !routed(we) {
			t.Errorf("%s taken out of traffic by a draining replica: annotations %v", x.w.Key, we.Annotations)
		}
		if got := x.tookOut(); got != 0 {
			t.Errorf("out-of-traffic count = %v, want 0", got)
		}
	}
}

func equalCounts(got, want map[string]int) bool {
	if len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}
