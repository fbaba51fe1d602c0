package revisions

import (
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/meshkit"
	"github.com/embark-mesh/embark/test/testenv"
)

// TestVMsFollowTheirNamespaceRevision runs a canary upgrade with a VM
// connected: a real pilot-agent relayed through one Embark that serves the
// default and the canary istiod. Labelling the namespace istio.io/rev=canary
// moves the VM to the canary istiod (istioctl proxy-status against each
// istiod says which serves it), its certificate requests to the canary's
// CA, and the revision to its registration and its WorkloadEntry's
// annotation; removing the label moves it back. Throughout, its ADS stream to Embark stays the one
// it opened (no disconnect counted, AgentConnected and connectedAt
// unchanged) and it keeps its registration (same UID): no re-onboarding.
// The WorkloadGroup's istio.io/rev moves it too in a namespace without
// revision labels; a revision without an istiod leaves it on the default
// one with a Warning Event UnknownIstioRevision on the registration.
// The entry never carries istio.io/rev, so both istiods hold it (their
// /debug/configz) while the VM is on the canary and after the rollback:
// pods of either revision keep the VM as an endpoint throughout.
func TestVMsFollowTheirNamespaceRevision(t *testing.T) {
	ns := env.Namespace(t)
	wg := fixtures.WorkloadGroup(ns, map[string]string{"app": "ratings"})
	fixtures.CreateGroup(t.Context(), t, env.Client, wg)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: ns}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": "ratings"},
		Ports:    []corev1.ServicePort{{Name: "http", Port: 9080, TargetPort: intstr.FromInt32(9080)}},
	}}
	if err := env.Client.Create(t.Context(), svc); err != nil {
		t.Fatal(err)
	}
	ep := startEndpoint(t, ns)
	vm := register(t, wg, 11)
	agent := meshkit.StartSidecar(t, ep.xds, ep.rootFile, vm.VM, istioagent.Options{
		Labels: map[string]string{"app": "ratings"},
	})
	ads, resp := meshkit.Listeners(t, t.Context(), agent)
	var before connection
	fixtures.Eventually(t, time.Minute, "the VM AgentConnected", func() bool {
		var ok bool
		before, ok = connectionOf(t, vm)
		return ok
	})
	name := vm.Key.Name + "." + ns
	servedBy(t, name, def, canary)
	if !configHolds(t, def, vm) || !configHolds(t, canary, vm) {
		t.Errorf("an entry without istio.io/rev: held by the default istiod %v, by the canary %v; want both", configHolds(t, def, vm), configHolds(t, canary, vm))
	}

	steps := []struct {
		name       string
		nsRevision string // "": the label removed
		to, from   *testenv.Istiod
		wantRev    string // on the registration and the WorkloadEntry's annotation
	}{
		{name: "canary", nsRevision: "canary", to: canary, from: def, wantRev: "canary"},
		{name: "rollback", to: def, from: canary, wantRev: ""},
	}
	for _, step := range steps {
		issuedBefore := issued(t, step.to)
		start := time.Now()
		labelNamespace(t, ns, step.nsRevision)
		servedBy(t, name, step.to, step.from)
		t.Logf("%s: the VM is served by the %s istiod %s after the namespace was labelled", step.name, revName(step.wantRev), time.Since(start).Round(10*time.Millisecond))
		fixtures.Eventually(t, 30*time.Second, step.name+": the revision recorded", func() bool {
			c, _ := connectionOf(t, vm)
			rev, has := entryRevision(t, vm)
			return c.revision == step.wantRev && rev == step.wantRev && has == (step.wantRev != "")
		})
		// Its certificate requests go to the serving revision's CA.
		if err := requestCertificate(t, ep, vm); err != nil {
			t.Fatalf("%s: certificate request through Embark: %v", step.name, err)
		}
		if got := issued(t, step.to); got <= issuedBefore {
			t.Errorf("%s: the %s istiod's CA issued no certificate (%v before, %v after) for a request of the VM it serves", step.name, revName(step.wantRev), issuedBefore, got)
		}
		after, ok := connectionOf(t, vm)
		switch {
		case !ok:
			t.Errorf("%s: the VM is no longer AgentConnected", step.name)
		case after.uid != vm.UID:
			t.Errorf("%s: the registration was re-created (UID %s, was %s)", step.name, after.uid, vm.UID)
		case !after.cond.LastTransitionTime.Equal(&before.cond.LastTransitionTime) || !after.connectedAt.Equal(before.connectedAt) || after.disconnected:
			t.Errorf("%s: the connection changed: %+v connected at %v, then %+v connected at %v (disconnected: %v)", step.name, before.cond, before.connectedAt, after.cond, after.connectedAt, after.disconnected)
		}
		fams := meshkit.Scrape(t, ep.metrics)
		if c, d := metric(fams, "embark_xds_connects_total", nil), metric(fams, "embark_xds_disconnects_total", nil); c != 1 || d != 0 {
			t.Errorf("%s: %v connects and %v disconnects counted, want the one connect: the VM's stream to Embark was closed", step.name, c, d)
		}
		if got := metric(fams, "embark_xds_relay_streams", map[string]string{"istiod_revision": revName(step.wantRev)}); got != 1 {
			t.Errorf("%s: embark_xds_relay_streams{istiod_revision=%q} = %v, want 1", step.name, revName(step.wantRev), got)
		}
		// The stream still carries the VM's configuration.
		if err := ads.Send(resource.ListenerType, nil, resp.GetVersionInfo(), resp.GetNonce()); err != nil {
			t.Errorf("%s: the VM's ADS stream: %v", step.name, err)
		}
		// The entry is mesh data every revision sees, as a pod's endpoints:
		// istiod filters WorkloadEntries by their istio.io/rev label
		// (crdclient, config.LabelsInRevision), so an entry labelled with
		// the serving revision would leave the other istiod's pods without
		// the VM as an endpoint while it is moved.
		fixtures.Eventually(t, 30*time.Second, step.name+": the entry held by both istiods", func() bool {
			return configHolds(t, def, vm) && configHolds(t, canary, vm)
		})
	}

	// The WorkloadGroup's own istio.io/rev counts in a namespace without
	// revision labels, as a pod's does.
	labelGroup(t, ns, wg.Name, "canary")
	servedBy(t, name, canary, def)
	labelGroup(t, ns, wg.Name, "")
	servedBy(t, name, def, canary)

	// A revision this Embark has no istiod for: the default serves the VM,
	// and the registration says why.
	labelNamespace(t, ns, "nope")
	fixtures.WaitEvent(t, env.Client, ns, vm.Key.Name, "UnknownIstioRevision", `"nope"`)
	servedBy(t, name, def, canary)
	if c, ok := connectionOf(t, vm); !ok || c.revision != "" {
		t.Errorf("unknown revision: connected %v, registration revision %q; want connected to the default revision", ok, c.revision)
	}
}

// labelGroup sets the istio.io/rev label of WorkloadGroup ns/name to rev, or
// removes it.
func labelGroup(t *testing.T, ns, name, rev string) {
	t.Helper()
	wg := &istionetworkingv1.WorkloadGroup{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, wg); err != nil {
		t.Fatal(err)
	}
	setLabel(&wg.Labels, rev)
	if err := env.Client.Update(t.Context(), wg); err != nil {
		t.Fatal(err)
	}
}

// setLabel sets istio.io/rev in *labels to rev, or removes it.
func setLabel(labels *map[string]string, rev string) {
	if *labels == nil {
		*labels = map[string]string{}
	}
	if rev == "" {
		delete(*labels, "istio.io/rev")
	} else {
		(*labels)["istio.io/rev"] = rev
	}
}

// servedBy waits until istioctl proxy-status lists name through istiod to
// and no longer through from.
func servedBy(t *testing.T, name string, to, from *testenv.Istiod) {
	t.Helper()
	rev := func(i *testenv.Istiod) string {
		if i == canary {
			return "canary"
		}
		return "default"
	}
	deadline := time.Now().Add(time.Minute)
	for {
		row, out := proxyStatus(t, to, rev(to), name)
		gone, outFrom := proxyStatus(t, from, rev(from), name)
		if row != nil && gone == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("istioctl never listed %s through the %s istiod only:\n%s istiod:\n%s\n%s istiod:\n%s", name, rev(to), rev(to), out, rev(from), outFrom)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// labelNamespace sets ns's istio.io/rev label to rev, or removes it.
func labelNamespace(t *testing.T, ns, rev string) {
	t.Helper()
	n := &corev1.Namespace{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Name: ns}, n); err != nil {
		t.Fatal(err)
	}
	setLabel(&n.Labels, rev)
	if err := env.Client.Update(t.Context(), n); err != nil {
		t.Fatal(err)
	}
}

// revName is a revision as metrics and istioctl name it.
func revName(rev string) string {
	if rev == "" {
		return "default"
	}
	return rev
}
