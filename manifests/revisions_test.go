package manifests

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	sigsyaml "sigs.k8s.io/yaml"
)

// objectKey names an object: kind, namespace, name.
func objectKey(o *unstructured.Unstructured) string {
	return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

// podLabels are the labels of the Pods of a rendering's Deployment.
func podLabels(t *testing.T, objs []*unstructured.Unstructured) labels.Set {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			var dep appsv1.Deployment
			if err := into(o, &dep); err != nil {
				t.Fatal(err)
			}
			return dep.Spec.Template.Labels
		}
	}
	t.Fatal("no Deployment rendered")
	return nil
}

// selectors are the label selectors of a rendering that pick the
// endpoint's Pods: the Deployment's, the Services', the
// PodDisruptionBudget's and the NetworkPolicy's, by object.
func selectors(objs []*unstructured.Unstructured) map[string]map[string]string {
	paths := map[string][]string{
		"Deployment":          {"spec", "selector", "matchLabels"},
		"Service":             {"spec", "selector"},
		"PodDisruptionBudget": {"spec", "selector", "matchLabels"},
		"NetworkPolicy":       {"spec", "podSelector", "matchLabels"},
	}
	out := map[string]map[string]string{}
	for _, o := range objs {
		if p, ok := paths[o.GetKind()]; ok {
			m, _, _ := unstructured.NestedStringMap(o.Object, p...)
			out[objectKey(o)] = m
		}
	}
	return out
}

// checkApart checks two releases' renderings share no object and neither
// selects the other's Pods.
func checkApart(t *testing.T, a, b []*unstructured.Unstructured) {
	t.Helper()
	keys := map[string]bool{}
	for _, o := range a {
		keys[objectKey(o)] = true
	}
	for _, o := range b {
		if keys[objectKey(o)] {
			t.Errorf("both releases render %s: the second install fails (Helm: cannot be imported, exists)", objectKey(o))
		}
	}
	for _, pair := range []struct {
		objs []*unstructured.Unstructured
		pods labels.Set
	}{{a, podLabels(t, b)}, {b, podLabels(t, a)}} {
		for key, sel := range selectors(pair.objs) {
			if len(sel) == 0 || labels.SelectorFromSet(sel).Matches(pair.pods) {
				t.Errorf("%s selector %v selects the other release's Pods %v", key, sel, pair.pods)
			}
		}
	}
}

// Two releases of the chart, for two istiod revisions, install side by
// side in one namespace, as Istio's own revisions do: every object of a
// revision's release carries the revision in its name (istiod-<revision>
// style), cluster-scoped ones and the workload namespaces' RoleBindings
// included; no selector of one picks the other's Pods; each release's
// bindings grant its own ServiceAccount its own roles; and the real API
// server stores both, each applied by its own field manager without
// forcing (a shared object would conflict). The default release (no
// revision) and a revision's share nothing either.
func TestTwoRevisionsInstallSideBySide(t *testing.T) {
	ns, workloads := env.Namespace(t), env.Namespace(t)
	release := func(name, rev, host string) []*unstructured.Unstructured {
		t.Helper()
		_, objs := renderRelease(t, name, ns, map[string]any{"istiodRevision": rev, "hosts": []any{host},
			"workloadNamespaces": []any{workloads}, "tls": map[string]any{"secretName": name + "-tls"}})
		return objs
	}
	stable := release("embark-1-30", "1-30", "vms-1-30.example.corp")
	canary := release("embark-1-31", "1-31", "vms-1-31.example.corp")
	checkApart(t, stable, canary)
	_, def := renderRelease(t, "embark", ns, map[string]any{"workloadNamespaces": []any{workloads}})
	checkApart(t, def, canary)

	for rev, objs := range map[string][]*unstructured.Unstructured{"1-30": stable, "1-31": canary} {
		for _, o := range objs {
			if !strings.HasSuffix(o.GetName(), "-"+rev) {
				t.Errorf("%s: the name does not carry the revision %s", objectKey(o), rev)
			}
		}
		cfg := endpointConfig(t, mustFind(t, objs, "ConfigMap", "onboarding-endpoint-"+rev))
		if want := "onboarding-token-signing-key-" + rev; cfg.TokenIssuer.JWT.SigningKeySecret != want {
			t.Errorf("revision %s signs tokens with Secret %q, want its own %s", rev, cfg.TokenIssuer.JWT.SigningKeySecret, want)
		}
		mustFind(t, objs, "Secret", "onboarding-token-signing-key-"+rev)
		if cfg.Istiod.Revision != rev {
			t.Errorf("revision %s: the endpoint serves istiod revision %q", rev, cfg.Istiod.Revision)
		}
		for _, o := range objs {
			checkBinding(t, o, "onboarding-endpoint-"+rev, rev)
		}
	}

	for name, objs := range map[string][]*unstructured.Unstructured{"embark-1-30": stable, "embark-1-31": canary} {
		var docs []string
		for _, o := range objs {
			if o.GetNamespace() == "" { // cluster-scoped: not deleted with the namespaces
				t.Cleanup(func() { _ = env.Client.Delete(context.WithoutCancel(t.Context()), o) })
			}
			data, err := sigsyaml.Marshal(o.Object)
			if err != nil {
				t.Fatal(err)
			}
			docs = append(docs, string(data))
		}
		got, err := env.Kubectl(t.Context(), []byte(strings.Join(docs, "---\n")), "apply", "--server-side", "--field-manager=helm-"+name, "-f", "-")
		if err != nil {
			t.Fatalf("install %s beside the other: %v", name, err)
		}
		appliedAll(t, got, objs)
	}
}

// checkBinding checks a RoleBinding or ClusterRoleBinding binds the
// release's own ServiceAccount to a role carrying the release's revision.
func checkBinding(t *testing.T, o *unstructured.Unstructured, serviceAccount, rev string) {
	t.Helper()
	if o.GetKind() != "RoleBinding" && o.GetKind() != "ClusterRoleBinding" {
		return
	}
	role, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
	if !strings.HasSuffix(role, "-"+rev) {
		t.Errorf("%s binds role %s, not its revision's", objectKey(o), role)
	}
	subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
	for _, s := range subjects {
		if name := s.(map[string]any)["name"]; name != serviceAccount {
			t.Errorf("%s binds ServiceAccount %v, want %s", objectKey(o), name, serviceAccount)
		}
	}
}
