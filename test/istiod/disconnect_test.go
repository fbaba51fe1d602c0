package istiod

import (
	"testing"
	"time"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
)

// watchFor reads the endpoints istiod pushes to the pod for d and fails the
// test if any push satisfies bad (istiod pushes on every change, so no push
// is no change).
func (p *podProxy) watchFor(t *testing.T, d time.Duration, what string, bad func(map[string]vmEndpoint) bool) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case cla, open := <-p.updates:
			if !open {
				*p = *startPodProxyFor(t, p.ns, p.cluster) // istiod's max connection age: connect again
				continue
			}
			if m := endpointsOf(cla); bad(m) {
				t.Fatalf("%s: istiod served %+v", what, m)
			}
		case <-deadline:
			return
		}
	}
}

// A VM whose sidecar stops leaves the endpoints istiod serves a pod within
// registration.outOfTrafficAfter (default 10s), never before, for groups
// with and without a probe, while its registration lives on (grace period
// 1h here); the sidecar reconnecting puts it back, without onboarding
// again. The test logs the seconds from the sidecar's stop to the pod no
// longer seeing the VM.
func TestDeadVMLeavesPodsEndpointsWithinTheDelay(t *testing.T) {
	for _, tt := range []struct {
		name  string
		probe bool
		vm    int // the VM's address: 10.0.0.<vm>, one per test
	}{{name: "probe", probe: true, vm: 21}, {name: "no probe", vm: 23}} {
		t.Run(tt.name, func(t *testing.T) {
			ns := env.Namespace(t)
			wg := ratingsGroup(t, ns)
			if !tt.probe {
				wg.Spec.Probe = nil
				if err := env.Client.Update(t.Context(), wg); err != nil {
					t.Fatal(err)
				}
			}
			ep := startEndpoint(t, ns)
			vm := register(t, wg, tt.vm)
			s := vm.connect(t, ep)
			if tt.probe {
				s.reportHealth(t, true)
				waitHealthy(t, vm.Key, "True")
			}
			pod := startPodProxy(t, ns, "ratings", 9080)
			served := func(m map[string]vmEndpoint) bool { e, ok := m[vm.IP]; return ok && e.healthy }
			pod.waitFor(t, "the connected VM", served)

			s.cancel() // the VM powers off: its sidecar's stream ends
			stopped := time.Now()
			pod.waitFor(t, "the stopped VM out of the endpoints", func(m map[string]vmEndpoint) bool { return !served(m) })
			took := time.Since(stopped)
			t.Logf("%s: pod no longer sees the VM %.1fs after its sidecar stopped (outOfTrafficAfter %v)", tt.name, took.Seconds(), config.DefaultOutOfTrafficAfter)
			if took < config.DefaultOutOfTrafficAfter {
				t.Errorf("the VM left the endpoints %v after its sidecar stopped, before outOfTrafficAfter (%v)", took, config.DefaultOutOfTrafficAfter)
			}
			war := &runtimev1alpha1.WorkloadAutoRegistration{}
			if err := env.Client.Get(t.Context(), vm.Key, war); err != nil {
				t.Fatalf("registration gone with the VM out of traffic: %v", err)
			}
			if _, err := getEntry(t, vm.Key); err != nil {
				t.Fatalf("WorkloadEntry gone with the VM out of traffic: %v", err)
			}

			s = vm.connect(t, ep) // the VM is back: same registration, same token
			if tt.probe {
				s.reportHealth(t, true) // pilot-agent resends its probe's verdict on every new stream
			}
			back := time.Now()
			pod.waitFor(t, "the reconnected VM back in the endpoints", served)
			t.Logf("%s: pod sees the VM again %.1fs after its sidecar reconnected", tt.name, time.Since(back).Seconds())
		})
	}
}

// A replica that shuts down (rolled, or SIGTERM) takes no VM out of the
// pods' endpoints, even when its sidecars find no other replica for longer
// than outOfTrafficAfter; the VM reconnecting to another replica changes
// nothing the pod sees.
func TestReplicaShutdownTakesNoVMOutOfPodsEndpoints(t *testing.T) {
	ns := env.Namespace(t)
	wg := ratingsGroup(t, ns)
	a := startEndpointAs(t, ns, "replica-a-"+ns)
	b := startEndpointAs(t, ns, "replica-b-"+ns)
	vm := register(t, wg, 22)
	s := vm.connect(t, a)
	s.reportHealth(t, true)
	waitHealthy(t, vm.Key, "True")
	pod := startPodProxy(t, ns, "ratings", 9080)
	served := func(m map[string]vmEndpoint) bool { e, ok := m[vm.IP]; return ok && e.healthy }
	pod.waitFor(t, "the connected VM", served)

	a.stop()
	s.cancel()
	removed := func(m map[string]vmEndpoint) bool { return !served(m) }
	pod.watchFor(t, config.DefaultOutOfTrafficAfter+5*time.Second, "the VM stays an endpoint after its replica shut down", removed)
	s = vm.connect(t, b)
	s.reportHealth(t, true)
	pod.watchFor(t, 5*time.Second, "the VM stays an endpoint after reconnecting to another replica", removed)
	t.Logf("0 endpoint removals across a replica shutdown and %v without a stream", config.DefaultOutOfTrafficAfter+5*time.Second)
}
