package adversarial

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// renderChart renders Embark's Helm chart with vals merged over its
// values.yaml, as `helm template` does (the render module beside the chart,
// which holds Helm's SDK out of Embark's go.mod). It returns the objects,
// or the renderer's error output when the chart refuses the values.
func renderChart(t *testing.T, vals map[string]any) ([]*unstructured.Unstructured, string) {
	t.Helper()
	args := []string{"run", ".", "-namespace", "istio-system"}
	if vals != nil {
		data, err := json.Marshal(vals)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "-set-json", string(data))
	}
	cmd := exec.CommandContext(t.Context(), "go", append(args, "..")...)
	cmd.Dir = "../../manifests/charts/embark/render"
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return nil, stderr.String()
	}
	if err != nil {
		t.Fatalf("render the chart: %v\n%s", err, stderr.String())
	}
	var objs []*unstructured.Unstructured
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
	return objs, ""
}

// internalAnnotations are the annotations that make AWS, GCP and Azure
// provision an internal load balancer.
var internalAnnotations = map[string]string{
	"service.beta.kubernetes.io/aws-load-balancer-internal":   "true",
	"service.beta.kubernetes.io/aws-load-balancer-scheme":     "internal",
	"networking.gke.io/load-balancer-type":                    "Internal",
	"service.beta.kubernetes.io/azure-load-balancer-internal": "true",
}

// An attacker anywhere on the internet reaches the onboarding, xDS and
// metrics ports of a default install: the chart's vmgateway is an
// internet-facing LoadBalancer with no source ranges, and nothing restricts
// which pods reach the endpoint's metrics. The default render must be an
// internal load balancer (or one with source ranges) and a NetworkPolicy
// that admits the VM-facing ports and lets only the monitoring namespace
// scrape metrics; asking for a public load balancer without source ranges
// must be refused.
func TestDefaultChartExposesTheEndpointToTheInternet(t *testing.T) {
	Attack(t, "the Helm chart's default vmgateway is an internet-facing LoadBalancer without source ranges, and no NetworkPolicy guards the endpoint")
	objs, refused := renderChart(t, nil)
	if refused != "" {
		t.Fatalf("the default values are refused: %s", refused)
	}
	var svc *unstructured.Unstructured
	var policies []*networkingv1.NetworkPolicy
	for _, o := range objs {
		switch {
		case o.GetKind() == "Service" && o.GetName() == "vmgateway":
			svc = o
		case o.GetKind() == "NetworkPolicy":
			np := &networkingv1.NetworkPolicy{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, np); err != nil {
				t.Fatal(err)
			}
			policies = append(policies, np)
		}
	}
	if svc == nil {
		t.Fatal("no vmgateway Service rendered")
	}
	typ, _, _ := unstructured.NestedString(svc.Object, "spec", "type")
	ranges, _, _ := unstructured.NestedStringSlice(svc.Object, "spec", "loadBalancerSourceRanges")
	if typ == "LoadBalancer" && len(ranges) == 0 {
		ann := svc.GetAnnotations()
		for k, v := range internalAnnotations {
			if ann[k] != v {
				t.Errorf("default vmgateway: a LoadBalancer without source ranges and without %s: %q (internet-facing)", k, v)
			}
		}
	}

	// The endpoint's pods are guarded: ingress limited to the VM-facing
	// ports, metrics only from the monitoring namespace.
	var guard *networkingv1.NetworkPolicy
	for _, np := range policies {
		if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] == "onboarding-endpoint" {
			guard = np
		}
	}
	if guard == nil {
		t.Fatal("no NetworkPolicy selects the endpoint's pods: any pod in the cluster reaches every port")
	}
	isIngress := false
	for _, pt := range guard.Spec.PolicyTypes {
		isIngress = isIngress || pt == networkingv1.PolicyTypeIngress
	}
	if !isIngress {
		t.Errorf("NetworkPolicy %s does not restrict ingress: %v", guard.Name, guard.Spec.PolicyTypes)
	}
	metricsOpen := false
	for _, rule := range guard.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port == nil || *p.Port == intstr.FromString("http-metrics") || *p.Port == intstr.FromInt32(15014) {
				if len(rule.From) == 0 {
					metricsOpen = true
				}
				for _, peer := range rule.From {
					if peer.NamespaceSelector == nil || peer.IPBlock != nil {
						metricsOpen = true
					}
				}
			}
		}
		if len(rule.Ports) == 0 {
			metricsOpen = true // every port
		}
	}
	if metricsOpen {
		t.Errorf("NetworkPolicy %s admits the metrics port from outside a namespace selector: %+v", guard.Name, guard.Spec.Ingress)
	}

	// Asking for an internet-facing load balancer without source ranges is
	// refused, with a message naming the values.
	_, refused = renderChart(t, map[string]any{"service": map[string]any{"internal": false}})
	if refused == "" {
		t.Fatal("service.internal=false without loadBalancerSourceRanges rendered: an internet-facing load balancer open to everyone")
	}
	if !strings.Contains(refused, "loadBalancerSourceRanges") {
		t.Errorf("the refusal does not name service.loadBalancerSourceRanges: %s", refused)
	}
}
