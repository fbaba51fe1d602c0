package manifests

import (
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
)

// endpointConfig parses the configuration a ConfigMap carries exactly as the
// endpoint does at start.
func endpointConfig(t *testing.T, cm *unstructured.Unstructured) *config.Configuration {
	t.Helper()
	data, _, _ := unstructured.NestedString(cm.Object, "data", "config.yaml")
	cfg, err := config.Parse([]byte(data))
	if err != nil {
		t.Fatalf("ConfigMap %s: the endpoint would refuse its configuration: %v", cm.GetName(), err)
	}
	return cfg
}

func port(t *testing.T, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return int32(n)
}

// The base's parts agree with each other: the configuration parses, its
// ports are the container's and the Services', the probes reach the
// health endpoints, the pod runs hardened, and the cert-manager example
// issues the Secret the configuration names.
func TestBaseIsConsistent(t *testing.T) {
	_, objs := build(t, "base")
	cfg := endpointConfig(t, mustFind(t, objs, "ConfigMap", "onboarding-endpoint"))
	var dep appsv1.Deployment
	if err := into(mustFind(t, objs, "Deployment", "onboarding-endpoint"), &dep); err != nil {
		t.Fatal(err)
	}
	if cfg.Namespace != dep.Namespace {
		t.Errorf("configuration namespace %q, Deployment in %q", cfg.Namespace, dep.Namespace)
	}
	if r := dep.Spec.Replicas; r == nil || *r < 2 {
		t.Errorf("replicas %v, want at least 2", r)
	}
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for name, addr := range map[string]string{"grpc-onboard": cfg.Listen.Onboarding, "grpc-xds": cfg.Listen.XDS, "http-metrics": cfg.Listen.Metrics} {
		if ports[name] != port(t, addr) {
			t.Errorf("container port %s = %d, configuration listens on %s", name, ports[name], addr)
		}
	}
	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s probe missing", name)
			continue
		}
		if p.HTTPGet.Port.StrVal != "http-metrics" || (p.HTTPGet.Path != "/healthz" && p.HTTPGet.Path != "/readyz") {
			t.Errorf("%s probe %s on %s, want /healthz or /readyz on http-metrics", name, p.HTTPGet.Path, p.HTTPGet.Port.String())
		}
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probe on %s, want /readyz", c.ReadinessProbe.HTTPGet.Path)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("resource requests %v", c.Resources.Requests)
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("container securityContext %+v: want non-root, read-only root, no escalation, no capabilities", sc)
	}
	if pod.ServiceAccountName != "onboarding-endpoint" {
		t.Errorf("serviceAccountName %q", pod.ServiceAccountName)
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name"
	}) {
		t.Error("POD_NAME (the replica name) is not the pod name")
	}
	podLabels := labels.Set(dep.Spec.Template.Labels)

	// Services select the pods and reach named container ports.
	for _, name := range []string{"vmgateway", "onboarding-endpoint-metrics"} {
		var svc corev1.Service
		if err := into(mustFind(t, objs, "Service", name), &svc); err != nil {
			t.Fatal(err)
		}
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
			t.Errorf("Service %s selector %v does not select the pods %v", name, svc.Spec.Selector, podLabels)
		}
		for _, p := range svc.Spec.Ports {
			if _, ok := ports[p.TargetPort.StrVal]; !ok {
				t.Errorf("Service %s port %s targets %s, not a container port", name, p.Name, p.TargetPort.String())
			}
		}
	}
	checkGatewayPorts(t, objs, cfg)
	var pdb policyv1.PodDisruptionBudget
	if err := into(mustFind(t, objs, "PodDisruptionBudget", "onboarding-endpoint"), &pdb); err != nil {
		t.Fatal(err)
	}
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() < 1 || pdb.Spec.MinAvailable.IntValue() >= int(*dep.Spec.Replicas) {
		t.Errorf("PodDisruptionBudget minAvailable %v with %d replicas", pdb.Spec.MinAvailable, *dep.Spec.Replicas)
	}

	// The cert-manager example issues what the configuration reads.
	_, certObjs := build(t, "examples/cert-manager")
	cert := mustFind(t, certObjs, "Certificate", "onboarding-endpoint-tls")
	secretName, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	if secretName != cfg.Endpoint.SecretName {
		t.Errorf("Certificate writes Secret %q, the configuration reads %q", secretName, cfg.Endpoint.SecretName)
	}
	dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	if !slices.Equal(dnsNames, cfg.Endpoint.Hosts) {
		t.Errorf("Certificate dnsNames %v, endpoint hosts %v", dnsNames, cfg.Endpoint.Hosts)
	}
	if cert.GetNamespace() != cfg.Namespace {
		t.Errorf("Certificate in %q, the endpoint reads Secrets in %q", cert.GetNamespace(), cfg.Namespace)
	}
}

// workloadRoleBinding is the RoleBinding of the endpoint's rights in one
// workload namespace (workload-namespaces/).
const workloadRoleBinding = "embark-onboarding-endpoint-workloads"

// The endpoint has rights exactly where it watches: every namespace of a
// configuration's workloadNamespaces has the RoleBinding, and no other, in
// every kustomization that installs the endpoint.
func TestWorkloadNamespacesAgree(t *testing.T) {
	for _, tt := range []struct{ dir, configMap string }{
		{dir: ".", configMap: "onboarding-endpoint"},
		{dir: "istio-operator", configMap: "onboarding-endpoint-istiod"},
	} {
		t.Run(tt.dir, func(t *testing.T) {
			_, objs := build(t, tt.dir)
			cfg := endpointConfig(t, mustFind(t, objs, "ConfigMap", tt.configMap))
			if len(cfg.WorkloadNamespaces) == 0 {
				t.Fatal("the configuration sets no workloadNamespaces: the endpoint would need cluster-wide rights")
			}
			var bound []string
			for _, o := range objs {
				if o.GetKind() == "RoleBinding" && o.GetName() == workloadRoleBinding {
					bound = append(bound, o.GetNamespace())
					ref, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
					if ref != workloadRoleBinding {
						t.Errorf("RoleBinding in %s grants %s, want %s", o.GetNamespace(), ref, workloadRoleBinding)
					}
				}
				if o.GetKind() == "ClusterRoleBinding" {
					if ref, _, _ := unstructured.NestedString(o.Object, "roleRef", "name"); ref == workloadRoleBinding {
						t.Errorf("ClusterRoleBinding %s grants the workload rights cluster-wide", o.GetName())
					}
				}
			}
			want := slices.Sorted(slices.Values(cfg.WorkloadNamespaces))
			slices.Sort(bound)
			if !slices.Equal(bound, want) {
				t.Errorf("RoleBindings of %s in %v, workloadNamespaces %v", workloadRoleBinding, bound, want)
			}
		})
	}
}

// The own-namespace Role names exactly the Secrets the configuration uses
// (the signing key, updated; the serving certificate, read), and the base
// creates the signing-key Secret empty for the endpoint to fill.
func TestOwnNamespaceSecretsAreNamed(t *testing.T) {
	_, objs := build(t, "base")
	cfg := endpointConfig(t, mustFind(t, objs, "ConfigMap", "onboarding-endpoint"))
	role := mustFind(t, objs, "Role", "embark-onboarding-endpoint")
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	want := map[string]string{cfg.TokenIssuer.JWT.SigningKeySecret: "get,list,watch,update", cfg.Endpoint.SecretName: "get,list,watch"}
	got := map[string]string{}
	for _, r := range rules {
		rule := r.(map[string]any)
		res, _, _ := unstructured.NestedStringSlice(rule, "resources")
		if !slices.Contains(res, "secrets") {
			continue
		}
		names, _, _ := unstructured.NestedStringSlice(rule, "resourceNames")
		verbs, _, _ := unstructured.NestedStringSlice(rule, "verbs")
		if len(names) == 0 {
			t.Errorf("a rule grants %v on every Secret of the endpoint's namespace", verbs)
		}
		for _, n := range names {
			got[n] = strings.Join(verbs, ",")
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("Secrets of the Role: %v, want %v", got, want)
	}
	secret := mustFind(t, objs, "Secret", cfg.TokenIssuer.JWT.SigningKeySecret)
	if _, has := secret.Object["data"]; has {
		t.Error("the signing-key Secret carries data: re-applying would overwrite the endpoint's keys")
	}
}
