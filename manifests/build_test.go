package manifests

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"
)

// kustomizations are every kustomize root under manifests/.
var kustomizations = []string{".", "base", "workload-namespaces", "standalone", "istio-operator", "istio-operator-multi-network", "monitoring", "examples/cert-manager"}

// build runs kustomize (the library kubectl embeds) on dir and returns the
// YAML stream and its objects.
func build(t *testing.T, dir string) ([]byte, []*unstructured.Unstructured) {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	objs, err := decodeAll(out)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	return out, objs
}

func decodeAll(data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if err.Error() == "EOF" {
				return objs, nil
			}
			return nil, err
		}
		if len(u.Object) == 0 {
			continue
		}
		objs = append(objs, u)
	}
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

func mustFind(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	o := find(objs, kind, name)
	if o == nil {
		t.Fatalf("no %s %s among %s", kind, name, kinds(objs))
	}
	return o
}

func kinds(objs []*unstructured.Unstructured) string {
	var s []string
	for _, o := range objs {
		s = append(s, o.GetKind()+"/"+o.GetName())
	}
	return strings.Join(s, " ")
}

// into converts an unstructured object into a typed one, refusing fields
// the type does not know.
func into(u *unstructured.Unstructured, out any) error {
	data, err := sigsyaml.Marshal(u.Object)
	if err != nil {
		return err
	}
	if err := sigsyaml.UnmarshalStrict(data, out); err != nil {
		return fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
	}
	return nil
}

func TestEveryKustomizationBuilds(t *testing.T) {
	want := map[string][]string{
		".": {"CustomResourceDefinition/workloadautoregistrations.runtime.onboarding.tetrate.io", "Deployment/onboarding-endpoint",
			"RoleBinding/embark-onboarding-endpoint-workloads"},
		"base": {
			"CustomResourceDefinition/onboardingpolicies.authorization.onboarding.tetrate.io",
			"CustomResourceDefinition/workloadautoregistrations.runtime.onboarding.tetrate.io",
			"ServiceAccount/onboarding-endpoint", "ClusterRole/embark-onboarding-endpoint",
			"ClusterRole/embark-onboarding-endpoint-workloads", "ClusterRole/embark-onboarding-endpoint-mesh-config",
			"ClusterRoleBinding/embark-onboarding-endpoint", "Role/embark-onboarding-endpoint",
			"RoleBinding/embark-onboarding-endpoint", "ConfigMap/onboarding-endpoint",
			"Deployment/onboarding-endpoint", "Service/vmgateway", "Service/onboarding-endpoint-metrics",
			"PodDisruptionBudget/onboarding-endpoint",
		},
		"workload-namespaces": {"RoleBinding/embark-onboarding-endpoint-workloads"},
		"standalone":          {"ClusterRoleBinding/embark-onboarding-endpoint-mesh-config"},
		"istio-operator": {"ConfigMap/onboarding-endpoint-istiod", "Service/vmgateway", "ClusterRoleBinding/embark-onboarding-endpoint",
			"RoleBinding/embark-onboarding-endpoint-workloads", "ClusterRoleBinding/embark-onboarding-endpoint-mesh-config"},
		"monitoring": {"ServiceMonitor/onboarding-endpoint", "PrometheusRule/embark", "ConfigMap/embark-grafana-dashboard"},
		"examples/cert-manager": {"Issuer/embark-selfsigned", "Certificate/embark-onboarding-ca", "Issuer/embark-onboarding-ca",
			"Certificate/onboarding-endpoint-tls"},
	}
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			_, objs := build(t, dir)
			for _, w := range want[dir] {
				kind, name, _ := strings.Cut(w, "/")
				if find(objs, kind, name) == nil {
					t.Errorf("%s lacks %s; has %s", dir, w, kinds(objs))
				}
			}
			for _, o := range objs {
				if o.GetKind() == "CustomResourceDefinition" || strings.HasPrefix(o.GetKind(), "Cluster") {
					continue
				}
				if o.GetKind() == "RoleBinding" && o.GetName() == workloadRoleBinding {
					continue // in its workload namespace (TestWorkloadNamespacesAgree)
				}
				if o.GetNamespace() != "istio-system" {
					t.Errorf("%s/%s is in namespace %q, want istio-system", o.GetKind(), o.GetName(), o.GetNamespace())
				}
			}
		})
	}
	// The istio-operator variant runs in istiod's Pod: no Deployment,
	// PodDisruptionBudget or ServiceAccount of its own.
	_, objs := build(t, "istio-operator")
	for _, k := range []string{"Deployment", "PodDisruptionBudget", "ServiceAccount"} {
		if o := find(objs, k, "onboarding-endpoint"); o != nil {
			t.Errorf("istio-operator builds %s onboarding-endpoint", k)
		}
	}
}
