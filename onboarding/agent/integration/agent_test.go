package integration

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/fixtures"
)

// The whole life of an agent: refused until a policy allows it, onboarded,
// tokens renewed, re-onboarded with the updated WorkloadGroup after `kubectl
// delete war`, unharmed by the endpoint going away for a while, and
// unregistered at shutdown.
func TestAgentLifecycle(t *testing.T) {
	w := newWorld(t)
	w.startEndpoint()
	// 1m onboarding tokens renewed after 6s; 1h sidecar tokens after ~11s.
	a := w.runAgent(agentRun{debug: true, renewFraction: 0.1, sidecarRenewFraction: 0.003})
	root, logs := a.root, a.logs
	restarts, stops := filepath.Join(root, "restarts"), filepath.Join(root, "stops")
	tokenFile := filepath.Join(root, "istio-token")

	t.Log("no OnboardingPolicy: refused with the endpoint's message, retried, nothing written")
	fixtures.Eventually(t, 30*time.Second, "PermissionDenied logged", func() bool { return strings.Count(logs.String(), "code=PermissionDenied") >= 2 })
	if !strings.Contains(logs.String(), "not authorized by any OnboardingPolicy") && !strings.Contains(logs.String(), "OnboardingPolic") {
		t.Errorf("the endpoint's message is not logged:\n%s", logs.String())
	}
	if n := len(w.registrations()); n != 0 || countLines(restarts) != 0 || countLines(tokenFile) != 0 {
		t.Fatalf("while refused: %d registrations, %d restarts", n, countLines(restarts))
	}

	t.Log("policy added: onboarded")
	w.allow()
	fixtures.Eventually(t, 30*time.Second, "sidecar restarted", func() bool { return countLines(restarts) == 1 })
	regs := w.registrations()
	if len(regs) != 1 {
		t.Fatalf("%d registrations, want 1", len(regs))
	}
	first := regs[0]
	if first.Spec.Registration.Agent.Version != "v0.0.0-test" || first.Spec.Registration.Host.Addresses[0].IP != "172.31.5.254" ||
		first.Spec.Identity.AWS.EC2.IAMRole != "ratings-role" {
		t.Errorf("registration spec %+v", first.Spec)
	}
	env0 := readFile(t, filepath.Join(root, "cluster.env"))
	if !strings.Contains(env0, "POD_NAME='"+first.Name+"'") || !strings.Contains(env0, "POD_NAMESPACE='"+w.ns+"'") {
		t.Errorf("cluster.env:\n%s", env0)
	}
	if !strings.Contains(readFile(t, filepath.Join(root, "mesh.yaml")), "discoveryAddress: "+endpointHost) {
		t.Errorf("mesh.yaml:\n%s", readFile(t, filepath.Join(root, "mesh.yaml")))
	}
	token0 := readFile(t, tokenFile)
	if strings.Count(token0, ".") != 2 {
		t.Errorf("token file %q is not a JWT", token0)
	}

	t.Log("tokens renewed before they expire")
	fixtures.Eventually(t, 60*time.Second, "both tokens renewed", func() bool {
		l := logs.String()
		return strings.Contains(l, "onboarding token renewed") && strings.Contains(l, "sidecar token renewed")
	})
	if readFile(t, tokenFile) == token0 {
		t.Error("sidecar token file not rewritten")
	}
	if countLines(restarts) != 1 {
		t.Errorf("renewal restarted the sidecar (%d restarts)", countLines(restarts))
	}

	t.Log("kubectl delete war: re-onboarded with the updated WorkloadGroup")
	wg := &istionetworkingv1.WorkloadGroup{}
	must(t, env.Client.Get(t.Context(), client.ObjectKey{Namespace: w.ns, Name: "ratings"}, wg))
	wg.Spec.Template.Labels["version"] = "v2"
	must(t, env.Client.Update(t.Context(), wg))
	if out, err := env.Kubectl(t.Context(), nil, "delete", "war", "-n", w.ns, first.Name); err != nil {
		t.Fatalf("kubectl delete war: %v: %s", err, out)
	}
	fixtures.Eventually(t, 30*time.Second, "sidecar restarted after re-onboarding", func() bool { return countLines(restarts) == 2 })
	regs = w.registrations()
	if len(regs) != 1 || regs[0].UID == first.UID {
		t.Fatalf("after delete: %d registrations (same UID: %v), want a new one", len(regs), len(regs) == 1 && regs[0].UID == first.UID)
	}
	snap, err := registry.GroupSpec(regs[0].Spec.WorkloadGroup)
	must(t, err)
	if snap.GetTemplate().GetLabels()["version"] != "v2" {
		t.Errorf("new snapshot labels %v, want version v2", snap.GetTemplate().GetLabels())
	}
	if !strings.Contains(readFile(t, filepath.Join(root, "cluster.env")), `"version":"v2"`) {
		t.Errorf("cluster.env not rewritten with the new labels")
	}

	t.Log("endpoint down for a while: the bootstrap stays, nothing restarts")
	bootstrapBefore := readFile(t, filepath.Join(root, "cluster.env"))
	w.stopEndpoint()
	fixtures.Eventually(t, 30*time.Second, "watch interruption logged", func() bool {
		return strings.Count(logs.String(), "registration watch interrupted") >= 2
	})
	if countLines(restarts) != 2 || readFile(t, filepath.Join(root, "cluster.env")) != bootstrapBefore {
		t.Errorf("the outage changed the sidecar: %d restarts", countLines(restarts))
	}
	w.startEndpoint()
	second := w.registrations()[0]
	if out, err := env.Kubectl(t.Context(), nil, "delete", "war", "-n", w.ns, second.Name); err != nil {
		t.Fatalf("kubectl delete war: %v: %s", err, out)
	}
	fixtures.Eventually(t, 30*time.Second, "re-onboarded after the outage", func() bool { return countLines(restarts) == 3 })

	t.Log("graceful shutdown: unregistered, then the sidecar stopped")
	must(t, a.stopWithin(30*time.Second))
	if n := len(w.registrations()); n != 0 {
		t.Errorf("%d registrations after shutdown, want 0", n)
	}
	if countLines(stops) != 1 {
		t.Errorf("%d sidecar stops, want 1", countLines(stops))
	}
	if !strings.Contains(logs.String(), "unregistered; waiting the propagation delay") {
		t.Errorf("shutdown not logged:\n%s", logs.String())
	}
}
