package manifests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/yannh/kubeconform/pkg/validator"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	sigsyaml "sigs.k8s.io/yaml"
)

// schemaLocation is where writeSchemas puts one JSON schema per kind, in the
// layout kubeconform's local registry reads.
const schemaLocation = "{{ .Group }}/{{ .ResourceAPIVersion }}/{{ .ResourceKind }}.json"

// writeSchemas turns the API server's /openapi/v2 document (built-in kinds
// and every installed CRD) into strict standalone JSON schemas, one per kind
// of objs, under dir: the definition a kind names plus every definition it
// references, objects closed to unknown properties (as `kubeconform
// -strict` schemas are), and the two string-or-number types of Kubernetes
// opened to both. No network: the schemas are the real API server's.
func writeSchemas(t *testing.T, dir string, objs []*unstructured.Unstructured) {
	t.Helper()
	hc, err := rest.HTTPClientFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(strings.TrimSuffix(env.Config.Host, "/") + "/openapi/v2")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/openapi/v2: %s", resp.Status)
	}
	var doc struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	byGVK := map[string]string{}
	for name, def := range doc.Definitions {
		gvks, _ := def["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			m := g.(map[string]any)
			byGVK[fmt.Sprintf("%s/%s/%s", m["group"], m["version"], m["kind"])] = name
		}
		strict(def)
	}
	doc.Definitions["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = map[string]any{"type": []any{"string", "integer"}}
	doc.Definitions["io.k8s.apimachinery.pkg.api.resource.Quantity"] = map[string]any{"type": []any{"string", "number"}}
	for _, o := range objs {
		gv := o.GroupVersionKind()
		name, ok := byGVK[fmt.Sprintf("%s/%s/%s", gv.Group, gv.Version, gv.Kind)]
		if !ok {
			continue // kubeconform reports the missing schema
		}
		defs := map[string]any{}
		closure(doc.Definitions, name, defs)
		data, err := json.Marshal(map[string]any{"$ref": "#/definitions/" + name, "definitions": defs})
		if err != nil {
			t.Fatal(err)
		}
		group := gv.Group
		if group == "" {
			group = gv.Version // kubeconform names the core group by its version
		}
		path := filepath.Join(dir, group, gv.Version, strings.ToLower(gv.Kind)+".json")
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// strict closes every object schema that lists its properties and does not
// say it keeps unknown fields.
func strict(node any) {
	switch n := node.(type) {
	case map[string]any:
		_, props := n["properties"]
		_, addl := n["additionalProperties"]
		if props && !addl && n["x-kubernetes-preserve-unknown-fields"] != true {
			n["additionalProperties"] = false
		}
		for _, v := range n {
			strict(v)
		}
	case []any:
		for _, v := range n {
			strict(v)
		}
	}
}

func closure(all map[string]map[string]any, name string, out map[string]any) {
	if _, done := out[name]; done {
		return
	}
	def := all[name]
	out[name] = def
	var walk func(any)
	walk = func(node any) {
		switch n := node.(type) {
		case map[string]any:
			if ref, ok := n["$ref"].(string); ok {
				closure(all, strings.TrimPrefix(ref, "#/definitions/"), out)
			}
			for _, v := range n {
				walk(v)
			}
		case []any:
			for _, v := range n {
				walk(v)
			}
		}
	}
	walk(def)
}

func kubeconform(t *testing.T, objs []*unstructured.Unstructured) validator.Validator {
	t.Helper()
	dir := t.TempDir()
	writeSchemas(t, dir, objs)
	v, err := validator.New([]string{filepath.Join(dir, schemaLocation)}, validator.Opts{Strict: false})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Every object kustomize builds (built-in kinds, Embark's and Istio's CRDs)
// is valid for the real API server's schemas.
func TestKubeconformAcceptsEveryObject(t *testing.T) {
	for _, dir := range []string{".", "base", "istio-operator"} {
		t.Run(dir, func(t *testing.T) {
			out, objs := build(t, dir)
			v := kubeconform(t, objs)
			results := v.Validate(dir, io.NopCloser(bytes.NewReader(out)))
			if len(results) != len(objs) {
				t.Errorf("kubeconform saw %d resources, kustomize built %d", len(results), len(objs))
			}
			for _, r := range results {
				if r.Status != validator.Valid {
					sig, _ := r.Resource.Signature()
					t.Errorf("%v %v: status %d: %v", sig.Kind, sig.Name, r.Status, r.Err)
				}
			}
		})
	}
	// The Helm chart, rendered with its defaults and with the installation
	// options of TestChartServerSideDryRun.
	for name, vals := range map[string]map[string]any{
		"chart defaults": nil,
		"chart internal load balancer, revision, replicas": {
			"replicas": 3, "istiodRevision": "1-30",
			"service": map[string]any{"type": "LoadBalancer", "annotations": map[string]any{"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"}},
		},
		"chart Pod options, autoscaling, roots from a ConfigMap": chartPodOptions,
	} {
		t.Run(name, func(t *testing.T) {
			out, objs := renderChart(t, vals)
			v := kubeconform(t, objs)
			results := v.Validate(name, io.NopCloser(bytes.NewReader(out)))
			if len(results) != len(objs) {
				t.Errorf("kubeconform saw %d resources, the chart rendered %d", len(results), len(objs))
			}
			for _, r := range results {
				if r.Status != validator.Valid {
					sig, _ := r.Resource.Signature()
					t.Errorf("%v %v: status %d: %v", sig.Kind, sig.Name, r.Status, r.Err)
				}
			}
		})
	}
}

// The schemas are strict enough to catch the mistakes they exist for.
func TestKubeconformRejectsBrokenObjects(t *testing.T) {
	_, objs := build(t, "base")
	v := kubeconform(t, objs)
	for _, tc := range []struct{ name, yaml string }{
		{"unknown field", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 2\n  selector: {matchLabels: {a: b}}\n  template: {metadata: {labels: {a: b}}, spec: {containers: [{name: c, image: i}]}}\n"},
		{"wrong type", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports: [{port: \"http\"}]\n"},
		{"probe port object", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  selector: {matchLabels: {a: b}}\n  template: {metadata: {labels: {a: b}}, spec: {containers: [{name: c, image: i, readinessProbe: {httpGet: {port: {a: 1}}}}]}}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := v.Validate(tc.name, io.NopCloser(strings.NewReader(tc.yaml)))
			if len(res) != 1 || res[0].Status != validator.Invalid {
				t.Errorf("got %+v, want Invalid", res)
			}
		})
	}
}

// The monitoring objects' CRDs (Prometheus Operator) are not in the test
// API server: they decode strictly into the operator's own API types.
func TestMonitoringObjectsDecodeStrictly(t *testing.T) {
	_, objs := build(t, "monitoring")
	var sm monitoringv1.ServiceMonitor
	if err := into(mustFind(t, objs, "ServiceMonitor", "onboarding-endpoint"), &sm); err != nil {
		t.Error(err)
	}
	var pr monitoringv1.PrometheusRule
	if err := into(mustFind(t, objs, "PrometheusRule", "embark"), &pr); err != nil {
		t.Error(err)
	}
	if len(pr.Spec.Groups) == 0 {
		t.Error("no rule groups")
	}
	// The ServiceMonitor scrapes the metrics Service of the base by its port name.
	_, base := build(t, "base")
	svc := mustFind(t, base, "Service", "onboarding-endpoint-metrics")
	if !selects(sm.Spec.Selector.MatchLabels, svc.GetLabels()) {
		t.Errorf("ServiceMonitor selector %v does not select the metrics Service labels %v", sm.Spec.Selector.MatchLabels, svc.GetLabels())
	}
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	if len(sm.Spec.Endpoints) != 1 || len(ports) != 1 || ports[0].(map[string]any)["name"] != sm.Spec.Endpoints[0].Port {
		t.Errorf("ServiceMonitor endpoints %+v, Service ports %v", sm.Spec.Endpoints, ports)
	}
	// The dashboard ConfigMap carries the committed JSON unchanged.
	cm := mustFind(t, objs, "ConfigMap", "embark-grafana-dashboard")
	got, _, _ := unstructured.NestedString(cm.Object, "data", "embark-dashboard.json")
	want, err := os.ReadFile("monitoring/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Error("dashboard ConfigMap differs from monitoring/dashboard.json")
	}
	if _, err := sigsyaml.YAMLToJSON([]byte(got)); err != nil {
		t.Error(err)
	}
}

func selects(selector, lbls map[string]string) bool {
	for k, v := range selector {
		if lbls[k] != v {
			return false
		}
	}
	return len(selector) > 0
}
