//go:build faults

package faults

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/test/endpointproc"
	"github.com/embark-mesh/embark/test/testenv"
)

// istiodDown is how long istiod stays stopped in TestIstiodRestartResyncs:
// long enough for every relayed stream to see its upstream stream fail and
// retry at least once.
const istiodDown = 5 * time.Second

// The fleet's streams relayed to a real istiod (istiod mode) through one
// replica: istiod is stopped and started again. No sidecar stream to Embark
// closes (no agent opens a second stream), no registration's AgentConnected
// condition changes, and every stream is resynchronised: istiod answers
// each again and its agent ACKs the answer. The time from istiod's start
// to the last agent's ACK is logged; it is mostly istiod's own admission
// rate of new streams (PILOT_MAX_REQUESTS_PER_SECOND: 25/s on 2 cores), kept
// at its default here as in a cluster.
func TestIstiodRestartResyncs(t *testing.T) {
	n := fleet(t)
	i, err := testenv.StartIstiod(t.Context(), env, testenv.IstiodOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = i.Close() })
	roots := filepath.Join(t.TempDir(), "istiod-root-cert.pem")
	if err := os.WriteFile(roots, i.RootCert, 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFixtureWith(t, 1, func(cfg *config.Configuration) {
		suiteConfig(cfg)
		cfg.Istiod = config.Istiod{Address: i.SecureGRPCAddr, ServerName: testenv.IstiodServerName, RootCertFile: roots}
	})
	r := f.replicas[0]
	agents := f.onboard(r, n)
	f.neverDeleted = true
	hold(agents, f.conns(n, r))
	t.Logf("%d connected through istiod and stored in %v", n, f.expect(2*time.Minute, all(agents, want{connected: true, replica: r.Name})))
	acked := func(a *endpointproc.Agent) bool { return a.ACKs() > 0 }
	waitAll(t, agents, time.Minute, "every agent ACKed istiod's first answer", acked)
	before := connectedSince(t, f.ns)
	connects, acks := map[*endpointproc.Agent]int64{}, map[*endpointproc.Agent]int64{}
	for _, a := range agents {
		connects[a], acks[a] = a.Connects(), a.ACKs()
	}

	i.Stop()
	time.Sleep(istiodDown)
	start := time.Now()
	if err := i.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	ready := time.Since(start)
	waitAll(t, agents, 2*time.Minute, "every stream resynchronised and ACKed again", func(a *endpointproc.Agent) bool { return a.ACKs() > acks[a] })
	t.Logf("all %d relayed streams resynchronised and ACKed again %v after istiod started (%v of it istiod's own start; istiod down %v)",
		n, time.Since(start).Round(time.Millisecond), ready.Round(time.Millisecond), istiodDown)

	for _, a := range agents {
		if a.Connects() != connects[a] || !a.Connected() {
			t.Errorf("%s: its stream to Embark was re-opened (%d streams, %d before) or is closed (%v)", a.Registration, a.Connects(), connects[a], a.LastError())
		}
	}
	after := connectedSince(t, f.ns)
	for name, at := range before {
		if got := after[name]; !got.Equal(&at) {
			t.Errorf("%s: AgentConnected changed across the istiod restart (last transition %v, then %v)", name, at, after[name])
		}
	}
	f.expect(30*time.Second, all(agents, want{connected: true, replica: r.Name}))
}

// waitAll waits until ok holds for every agent.
func waitAll(t *testing.T, agents []*endpointproc.Agent, timeout time.Duration, what string, ok func(*endpointproc.Agent) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		missing := 0
		for _, a := range agents {
			if !ok(a) {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d agents not after %v", what, missing, len(agents), timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// connectedSince is, per registration of ns, when its AgentConnected
// condition last changed (True required).
func connectedSince(t *testing.T, ns string) map[string]metav1.Time {
	t.Helper()
	wars := &runtimev1alpha1.WorkloadAutoRegistrationList{}
	if err := env.Client.List(t.Context(), wars, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	out := map[string]metav1.Time{}
	for _, war := range wars.Items {
		c := meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected)
		if c == nil || c.Status != metav1.ConditionTrue {
			t.Fatalf("%s: not AgentConnected: %+v", war.Name, c)
		}
		out[war.Name] = c.LastTransitionTime
	}
	return out
}
