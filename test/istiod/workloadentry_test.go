package istiod

import (
	"context"
	"testing"
	"time"

	istiometa "istio.io/api/meta/v1alpha1"
	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/meshkit"
)

func healthyOf(we *istionetworkingv1.WorkloadEntry) *istiometa.IstioCondition {
	for _, c := range we.Status.Conditions {
		if c.GetType() == "Healthy" {
			return c
		}
	}
	return nil
}

func getEntry(t *testing.T, key client.ObjectKey) (*istionetworkingv1.WorkloadEntry, error) {
	t.Helper()
	we := &istionetworkingv1.WorkloadEntry{}
	return we, env.Client.Get(t.Context(), key, we)
}

// waitHealthy waits until the workload's entry has Healthy=status.
func waitHealthy(t *testing.T, key client.ObjectKey, status string) *istionetworkingv1.WorkloadEntry {
	t.Helper()
	var we *istionetworkingv1.WorkloadEntry
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		var err error
		we, err = getEntry(t, key)
		return err == nil && healthyOf(we).GetStatus() == status, nil
	})
	if err != nil {
		t.Fatalf("WorkloadEntry %s never Healthy=%s: %v", key.Name, status, err)
	}
	return we
}

// istiod's own clean-up, made fast, runs for several periods beside
// connected, disconnected-within-grace and reconnected workloads: each keeps
// its one WorkloadEntry (same UID) and its Healthy condition. An entry that
// looks like istiod's own is deleted in the same window, so the clean-up
// demonstrably ran.
func TestIstiodKeepsEmbarkWorkloadEntries(t *testing.T) {
	ns := env.Namespace(t)
	wg := ratingsGroup(t, ns)
	ep := startEndpoint(t, ns)

	connected, disconnected, reconnected := register(t, wg, 1), register(t, wg, 2), register(t, wg, 3)
	streams := map[string]*stream{}
	for _, w := range []*workload{connected, disconnected, reconnected} {
		s := w.connect(t, ep)
		s.reportHealth(t, true)
		streams[w.Key.Name] = s
	}
	before := map[string]*istionetworkingv1.WorkloadEntry{}
	for _, w := range []*workload{connected, disconnected, reconnected} {
		before[w.Key.Name] = waitHealthy(t, w.Key, "True")
	}
	streams[disconnected.Key.Name].cancel()
	streams[reconnected.Key.Name].cancel()
	s := reconnected.connect(t, ep)
	s.reportHealth(t, true)

	// An entry that istiod takes for one it auto-registered, disconnected
	// long ago: its clean-up deletes it.
	decoy := &istionetworkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: "istiod-own", Namespace: ns, Annotations: map[string]string{
		"istio.io/autoRegistrationGroup": "ratings",
		"istio.io/disconnectedAt":        time.Now().Add(-time.Hour).UTC().Format(time.RFC3339Nano),
		"istio.io/workloadController":    "istiod-local",
	}}}
	decoy.Spec = istioapi.WorkloadEntry{Address: "10.9.9.9", Labels: map[string]string{"app": "other"}}
	if err := env.Client.Create(t.Context(), decoy); err != nil {
		t.Fatal(err)
	}

	// Three clean-up periods (10 × the grace period each), well past
	// 1.5 × the max connection age.
	deadline := time.Now().Add(30 * cleanupGrace)
	decoyGone := false
	for time.Now().Before(deadline) {
		if _, err := getEntry(t, client.ObjectKeyFromObject(decoy)); apierrors.IsNotFound(err) {
			decoyGone = true
		}
		for _, w := range []*workload{connected, disconnected, reconnected} {
			we, err := getEntry(t, w.Key)
			if err != nil {
				t.Fatalf("WorkloadEntry %s: %v (istiod's log:\n%s)", w.Key.Name, err, meshkit.Tail(istiod.Log()))
			}
			if we.UID != before[w.Key.Name].UID {
				t.Fatalf("WorkloadEntry %s was deleted and re-created (UID %s, was %s)", w.Key.Name, we.UID, before[w.Key.Name].UID)
			}
			// The disconnected workload's entry is taken out of traffic by
			// Embark itself after registration.outOfTrafficAfter (Healthy
			// False, reason AgentDisconnected); istiod's clean-up would
			// remove the condition instead.
			c := healthyOf(we)
			outByEmbark := w == disconnected && c.GetStatus() == "False" && c.GetReason() == runtimev1alpha1.ReasonAgentDisconnected
			if c.GetStatus() != "True" && !outByEmbark {
				t.Fatalf("WorkloadEntry %s lost its Healthy condition: %+v", w.Key.Name, c)
			}
			for _, k := range registry.IstiodAnnotations {
				if _, ok := we.Annotations[k]; ok {
					t.Fatalf("WorkloadEntry %s carries istiod's annotation %s", w.Key.Name, k)
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !decoyGone {
		t.Errorf("istiod never cleaned up the entry that looks like its own: its clean-up did not run in the window, so the test proves nothing")
	}
	list := &istionetworkingv1.WorkloadEntryList{}
	if err := env.Client.List(t.Context(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 3 {
		names := []string{}
		for _, we := range list.Items {
			names = append(names, we.Name)
		}
		t.Errorf("WorkloadEntries in %s: %v, want exactly the 3 of Embark's registrations (istiod auto-registered none)", ns, names)
	}
	// The disconnect is stored in the registration's status only: the entry
	// istiod reads keeps its connection annotations and gets no
	// disconnected-at.
	we, _ := getEntry(t, disconnected.Key)
	if _, ok := we.Annotations[registry.AnnotationDisconnectedAt]; ok {
		t.Errorf("disconnected workload's entry carries %s: %v", registry.AnnotationDisconnectedAt, we.Annotations)
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), disconnected.Key, war); err != nil {
		t.Fatal(err)
	}
	if war.Status.Connection == nil || war.Status.Connection.DisconnectedAt == nil {
		t.Errorf("disconnected workload's registration lacks status.connection.disconnectedAt: %+v", war.Status.Connection)
	}
}
