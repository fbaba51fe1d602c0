package manifests

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	sigsyaml "sigs.k8s.io/yaml"
)

const chartDir = "charts/embark"

// renderChart renders the Helm chart with Helm's Go SDK (the render
// module, kept out of Embark's go.mod) with vals merged over values.yaml,
// as the release embark in istio-system.
func renderChart(t *testing.T, vals map[string]any) ([]byte, []*unstructured.Unstructured) {
	t.Helper()
	return renderRelease(t, "embark", "istio-system", vals)
}

// renderRelease renders the chart as release in namespace.
func renderRelease(t *testing.T, release, namespace string, vals map[string]any) ([]byte, []*unstructured.Unstructured) {
	t.Helper()
	args := []string{"run", ".", "-namespace", namespace, "-release", release}
	if vals != nil {
		data, err := json.Marshal(vals)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "-set-json", string(data))
	}
	cmd := exec.CommandContext(t.Context(), "go", append(args, "..")...)
	cmd.Dir = chartDir + "/render"
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("render the chart: %v\n%s", err, stderr.String())
	}
	objs, err := decodeAll(out)
	if err != nil {
		t.Fatalf("rendered chart: %v", err)
	}
	return out, objs
}

// chartPodOptions are the chart's Pod, ServiceAccount and scaling options
// (the options of Istio's charts), every one set, with the VMs' roots from
// a ConfigMap.
var chartPodOptions = map[string]any{
	"global":            map[string]any{"hub": "registry.example.corp/istio"},
	"serviceAccount":    map[string]any{"annotations": map[string]any{"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/embark"}},
	"autoscaling":       map[string]any{"enabled": true, "minReplicas": 2, "maxReplicas": 6, "targetCPUUtilizationPercentage": 75},
	"mesh":              map[string]any{"rootCerts": map[string]any{"configMapName": "vm-roots", "key": "roots.pem"}},
	"priorityClassName": "system-cluster-critical",
	"topologySpreadConstraints": []any{map[string]any{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
		"labelSelector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "onboarding-endpoint"}}}},
	"affinity": map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": []any{
		map[string]any{"matchExpressions": []any{map[string]any{"key": "kubernetes.io/arch", "operator": "In", "values": []any{"amd64", "arm64"}}}}}}}},
	"tolerations":       []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "mesh", "effect": "NoSchedule"}},
	"podLabels":         map[string]any{"team": "mesh"},
	"extraEnv":          []any{map[string]any{"name": "AWS_REGION", "value": "eu-west-1"}},
	"extraVolumes":      []any{map[string]any{"name": "proxy-ca", "configMap": map[string]any{"name": "corp-proxy-ca"}}},
	"extraVolumeMounts": []any{map[string]any{"name": "proxy-ca", "mountPath": "/etc/proxy-ca", "readOnly": true}},
}

// The chart's default rendering, and ones with the installation options
// the API server serves, are accepted by a server-side dry run.
func TestChartServerSideDryRun(t *testing.T) {
	tests := []struct {
		name string
		vals map[string]any
	}{
		{name: "defaults"},
		{name: "internal load balancer, revision, digest", vals: map[string]any{
			"replicas": 3, "istiodRevision": "1-30",
			"image":   map[string]any{"repository": "registry.example.corp/embark", "digest": "sha256:" + strings.Repeat("b", 64)},
			"service": map[string]any{"type": "LoadBalancer", "annotations": map[string]any{"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"}},
		}},
		{name: "Pod options, autoscaling, roots from a ConfigMap", vals: chartPodOptions},
		{name: "local repository: signing key, Istio's sidecar packages from a volume", vals: repositoryWithSources},
	}
	createBookinfo(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, objs := renderChart(t, tc.vals)
			got, err := env.Kubectl(t.Context(), out, "apply", "--server-side", "--force-conflicts", "--field-manager=embark-test",
				"--dry-run=server", "-f", "-")
			if err != nil {
				t.Fatal(err)
			}
			appliedAll(t, got, objs)
		})
	}
}

// The chart and the kustomize base deploy the same thing: the same RBAC
// rules, container (ports, probes, security), Services (an internal load
// balancer), NetworkPolicy and configuration;
// the chart's CRDs, alerts and dashboard are the repository's; the chart,
// the base and the Makefile name the version of the VERSION file.
func TestChartMatchesKustomizeBase(t *testing.T) {
	_, chart := renderChart(t, nil)
	_, base := build(t, "base")
	field := func(o *unstructured.Unstructured, path ...string) any {
		v, _, _ := unstructured.NestedFieldNoCopy(o.Object, path...)
		return v
	}
	same := []struct {
		kind, name string
		path       []string
	}{
		{"ClusterRole", "embark-onboarding-endpoint", []string{"rules"}},
		{"ClusterRole", "embark-onboarding-endpoint-workloads", []string{"rules"}},
		{"ClusterRole", "embark-onboarding-endpoint-mesh-config", []string{"rules"}},
		{"Role", "embark-onboarding-endpoint", []string{"rules"}},
		{"ClusterRoleBinding", "embark-onboarding-endpoint", []string{"subjects"}},
		{"RoleBinding", "embark-onboarding-endpoint", []string{"subjects"}},
		{"Service", "vmgateway", []string{"spec", "ports"}},
		{"Service", "vmgateway", []string{"spec", "selector"}},
		{"Service", "vmgateway", []string{"metadata", "annotations"}},
		{"Service", "vmgateway", []string{"spec", "type"}},
		{"Service", "vmgateway", []string{"spec", "externalTrafficPolicy"}},
		{"NetworkPolicy", "onboarding-endpoint", []string{"spec"}},
		{"Service", "onboarding-endpoint-metrics", []string{"spec", "ports"}},
		{"Deployment", "onboarding-endpoint", []string{"spec", "replicas"}},
		{"Deployment", "onboarding-endpoint", []string{"spec", "selector"}},
		{"Deployment", "onboarding-endpoint", []string{"spec", "template", "spec", "securityContext"}},
		{"PodDisruptionBudget", "onboarding-endpoint", []string{"spec"}},
		{"Secret", "onboarding-token-signing-key", []string{"data"}},
		{"Secret", "onboarding-token-signing-key", []string{"type"}},
	}
	for _, s := range same {
		c, b := field(mustFind(t, chart, s.kind, s.name), s.path...), field(mustFind(t, base, s.kind, s.name), s.path...)
		if !reflect.DeepEqual(c, b) {
			t.Errorf("%s %s %v: chart %v, base %v", s.kind, s.name, s.path, c, b)
		}
	}
	// One RoleBinding of the workload rights per workload namespace, as
	// workload-namespaces/ binds bookinfo; standalone's read-only binding
	// only without istiod's xDS, as standalone/.
	_, wl := build(t, "workload-namespaces")
	for _, path := range [][]string{{"roleRef"}, {"subjects"}, {"metadata", "namespace"}} {
		c, b := field(mustFind(t, chart, "RoleBinding", workloadRoleBinding), path...), field(mustFind(t, wl, "RoleBinding", workloadRoleBinding), path...)
		if !reflect.DeepEqual(c, b) {
			t.Errorf("RoleBinding %s %v: chart %v, workload-namespaces %v", workloadRoleBinding, path, c, b)
		}
	}
	for _, o := range chart {
		if o.GetKind() == "ClusterRoleBinding" && o.GetName() != "embark-onboarding-endpoint" {
			t.Errorf("the chart's defaults (istiod mode) bind %s cluster-wide", o.GetName())
		}
	}
	_, standalone := build(t, "standalone")
	_, chartStandalone := renderChart(t, map[string]any{"istiod": map[string]any{"enabled": false}})
	for _, path := range [][]string{{"roleRef"}, {"subjects"}} {
		c, b := field(mustFind(t, chartStandalone, "ClusterRoleBinding", "embark-onboarding-endpoint-mesh-config"), path...),
			field(mustFind(t, standalone, "ClusterRoleBinding", "embark-onboarding-endpoint-mesh-config"), path...)
		if !reflect.DeepEqual(c, b) {
			t.Errorf("standalone ClusterRoleBinding %v: chart %v, standalone/ %v", path, c, b)
		}
	}
	container := func(objs []*unstructured.Unstructured) map[string]any {
		cs := field(mustFind(t, objs, "Deployment", "onboarding-endpoint"), "spec", "template", "spec", "containers").([]any)
		c := maps.Clone(cs[0].(map[string]any)) // the image is compared below
		delete(c, "image")
		return c
	}
	if c, b := container(chart), container(base); !reflect.DeepEqual(c, b) {
		cj, _ := json.Marshal(c)
		bj, _ := json.Marshal(b)
		t.Errorf("endpoint container differs:\nchart %s\nbase  %s", cj, bj)
	}
	if c, b := endpointConfig(t, mustFind(t, chart, "ConfigMap", "onboarding-endpoint")), endpointConfig(t, mustFind(t, base, "ConfigMap", "onboarding-endpoint")); !reflect.DeepEqual(c, b) {
		t.Errorf("configuration differs:\nchart %+v\nbase  %+v", c, b)
	}

	// make generate writes these copies; every CRD is one of them.
	pairs := [][2]string{
		{"charts/embark/files/prometheusrule.yaml", "monitoring/prometheusrule.yaml"},
		{"charts/embark/files/dashboard.json", "monitoring/dashboard.json"},
	}
	crds, err := filepath.Glob("../api/crds/*.onboarding.tetrate.io_*.yaml")
	if err != nil || len(crds) == 0 {
		t.Fatalf("no CRDs in ../api/crds: %v", err)
	}
	for _, crd := range crds {
		pairs = append(pairs, [2]string{"charts/embark/crds/" + filepath.Base(crd), crd})
	}
	if chartCRDs, _ := filepath.Glob("charts/embark/crds/*.yaml"); len(chartCRDs) != len(crds) {
		t.Errorf("the chart has %d CRD files, api/crds %d: run make generate", len(chartCRDs), len(crds))
	}
	for _, pair := range pairs {
		a, err := os.ReadFile(pair[0])
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(pair[1])
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s is not a copy of %s: run make generate", pair[0], pair[1])
		}
	}

	version, err := os.ReadFile("../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimSpace(string(version))
	var meta struct {
		Version, AppVersion string
	}
	data, err := os.ReadFile(chartDir + "/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := sigsyaml.Unmarshal(data, &meta); err != nil {
		t.Fatal(err)
	}
	if meta.AppVersion != want || "v"+meta.Version != want {
		t.Errorf("Chart.yaml version %s appVersion %s, want %s (VERSION)", meta.Version, meta.AppVersion, want)
	}
	images := map[string]string{}
	for name, objs := range map[string][]*unstructured.Unstructured{"chart": chart, "base": base} {
		img, _ := field(mustFind(t, objs, "Deployment", "onboarding-endpoint"), "spec", "template", "spec", "containers").([]any)[0].(map[string]any)["image"].(string)
		if !strings.HasSuffix(img, ":"+want) {
			t.Errorf("%s image %s, want tag %s (VERSION)", name, img, want)
		}
		images[name] = img
	}
	if images["chart"] != images["base"] {
		t.Errorf("the chart deploys image %s, the base %s", images["chart"], images["base"])
	}
	op, err := os.ReadFile("istio-operator/istio-operator.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(op), "image: embark-mesh/onboarding-endpoint:"+want+"\n") {
		t.Errorf("istio-operator.yaml does not name image tag %s (VERSION)", want)
	}
}

// The real endpoint, running as the chart's ServiceAccount with exactly
// the chart's RBAC (the test namespace as its workload namespace, and
// standalone: no istiod), starts and onboards a workload.
func TestChartRBACIsSufficientToOnboardAWorkload(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	f := newWorkloadFixture(t)
	_, objs := renderChart(t, map[string]any{"workloadNamespaces": []string{f.ns}, "istiod": map[string]any{"enabled": false}})
	applyObjects(t, objs)
	cfg := endpointConfig(t, mustFind(t, objs, "ConfigMap", "onboarding-endpoint"))
	if len(cfg.WorkloadNamespaces) != 1 || cfg.WorkloadNamespaces[0] != f.ns {
		t.Errorf("the chart's configuration has workloadNamespaces %v, want [%s]", cfg.WorkloadNamespaces, f.ns)
	}
	addrs := newEndpointAddrs(t)
	done := runEndpoint(t, ctx, writeEndpointConfig(t, cfg.Namespace, cfg.Endpoint.Hosts[0], f, addrs), impersonatingKubeconfig(t), "chart-rbac-0")
	_, token := onboard(t, ctx, addrs.onboarding, cfg.Endpoint.Hosts[0], f, "172.31.5.254")
	if err := unregister(t, ctx, addrs.onboarding, token); err != nil {
		t.Errorf("Unregister as the chart's ServiceAccount: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the endpoint stopped with %v", err)
		}
	case <-time.After(time.Minute):
		t.Error("the endpoint did not stop")
	}
}
