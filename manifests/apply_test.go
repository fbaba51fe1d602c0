package manifests

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// applied reports the objects `kubectl apply` printed, as kind/name.
func appliedAll(t *testing.T, out string, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		if !strings.Contains(out, "/"+o.GetName()+" ") {
			t.Errorf("apply did not report %s %s:\n%s", o.GetKind(), o.GetName(), out)
		}
	}
}

// The real API server accepts every object of the kustomizations whose
// kinds it serves (server-side apply, dry run: admission and validation run,
// nothing is stored).
func TestServerSideDryRun(t *testing.T) {
	createBookinfo(t)
	for _, dir := range []string{".", "base", "istio-operator"} {
		t.Run(dir, func(t *testing.T) {
			out, objs := build(t, dir)
			got, err := env.Kubectl(t.Context(), out, "apply", "--server-side", "--force-conflicts", "--field-manager=embark-test",
				"--dry-run=server", "-f", "-")
			if err != nil {
				t.Fatal(err)
			}
			appliedAll(t, got, objs)
		})
	}
}

// A broken object is refused by the same dry run, so the test above can fail.
func TestServerSideDryRunRefusesInvalidObjects(t *testing.T) {
	bad := "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: bad, namespace: istio-system}\nspec:\n  minAvailable: 1\n  maxUnavailable: 1\n  selector: {matchLabels: {a: b}}\n"
	if out, err := env.Kubectl(t.Context(), []byte(bad), "apply", "--server-side", "--dry-run=server", "-f", "-"); err == nil {
		t.Errorf("a PodDisruptionBudget with minAvailable and maxUnavailable was accepted: %s", out)
	}
}

// createBookinfo creates the workload namespace the manifests and the
// chart's defaults bind the endpoint in, as in a cluster where VMs join its
// WorkloadGroups (a RoleBinding needs its namespace, even in a dry run).
func createBookinfo(t *testing.T) {
	t.Helper()
	if err := env.Client.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bookinfo"}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}
