package main

import (
	"os"
	"strings"
	"testing"
)

const chartDir = ".."

// Bad values are refused by values.schema.json before anything renders,
// with a message naming the value.
func TestSchemaRefusesBadValues(t *testing.T) {
	tests := []struct {
		name    string
		vals    map[string]any
		wantErr string
	}{
		{name: "no replicas", vals: map[string]any{"replicas": 0}, wantErr: "replicas"},
		{name: "replicas not a number", vals: map[string]any{"replicas": "two"}, wantErr: "replicas"},
		{name: "no hosts", vals: map[string]any{"hosts": []any{}}, wantErr: "hosts"},
		{name: "host with a port", vals: map[string]any{"hosts": []any{"a.example.corp:443"}}, wantErr: "hosts"},
		{name: "unknown service type", vals: map[string]any{"service": map[string]any{"type": "Ingress"}}, wantErr: "service"},
		{name: "misspelt top-level key", vals: map[string]any{"replica": 3}, wantErr: "replica"},
		{name: "bad digest", vals: map[string]any{"image": map[string]any{"repository": "x", "digest": "sha256:abc"}}, wantErr: "digest"},
		{name: "cert-manager without an issuer", vals: map[string]any{"tls": map[string]any{"secretName": "s", "certManager": map[string]any{"enabled": true}}}, wantErr: "issuerRef"},
		{name: "bad memory quantity", vals: map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": "lots"}}}, wantErr: "memory"},
		{name: "bad revision", vals: map[string]any{"istiodRevision": "Canary_1"}, wantErr: "istiodRevision"},
		{name: "istiod address without a port", vals: map[string]any{"istiod": map[string]any{"address": "istiod.istio-system.svc"}}, wantErr: "address"},
		{name: "no workload namespaces", vals: map[string]any{"workloadNamespaces": []any{}}, wantErr: "workloadNamespaces"},
		{name: "workload namespace not a DNS label", vals: map[string]any{"workloadNamespaces": []any{"Book_Info"}}, wantErr: "workloadNamespaces"},
		{name: "misspelt istiod key", vals: map[string]any{"istiod": map[string]any{"relayXds": true}}, wantErr: "relayXds"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Render(chartDir, "embark", "istio-system", tc.vals)
			if err == nil {
				t.Fatalf("values %v rendered; want a schema error", tc.vals)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not name %q", err, tc.wantErr)
			}
		})
	}
}

// The defaults, and every toggle on, render and pass Helm's lint rules.
func TestRenders(t *testing.T) {
	tests := []struct {
		name  string
		vals  map[string]any
		wants []string
		nots  []string
	}{
		{name: "defaults", wants: []string{"kind: Deployment", "kind: ClusterRole", "image: embark-mesh/onboarding-endpoint:" + version(t), "type: LoadBalancer"},
			nots: []string{"kind: Certificate", "kind: ServiceMonitor", "istio.io/rev",
				// istiod mode reads no mesh configuration cluster-wide.
				"kind: ClusterRoleBinding\nmetadata:\n  name: embark-onboarding-endpoint-mesh-config"}},
		{name: "workload namespaces", vals: map[string]any{"workloadNamespaces": []any{"bookinfo", "payments"}},
			wants: []string{"workloadNamespaces:\n    - bookinfo\n    - payments\n",
				"name: embark-onboarding-endpoint-workloads\n  namespace: bookinfo\n", "name: embark-onboarding-endpoint-workloads\n  namespace: payments\n"}},
		{name: "everything on", vals: map[string]any{
			"replicas":       3,
			"istiodRevision": "1-30",
			"image":          map[string]any{"repository": "registry.example.corp/embark", "digest": "sha256:" + strings.Repeat("a", 64)},
			"tls":            map[string]any{"secretName": "embark-tls", "certManager": map[string]any{"enabled": true, "issuerRef": map[string]any{"name": "corp-ca", "kind": "ClusterIssuer"}}},
			"service":        map[string]any{"type": "LoadBalancer", "annotations": map[string]any{"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"}},
			"monitoring": map[string]any{"serviceMonitor": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true},
				"dashboard": map[string]any{"enabled": true}},
		}, wants: []string{"replicas: 3", "istio.io/rev: 1-30", "image: registry.example.corp/embark@sha256:", "kind: Certificate", "secretName: embark-tls",
			// The Role names the serving Secret, and only it and the signing key.
			"resourceNames: [embark-tls]",
			"aws-load-balancer-scheme: internal", "kind: ServiceMonitor", "kind: PrometheusRule", "runbook_url:", "embark-dashboard.json",
			// The revision's istiod, not the default one.
			"address: istiod-1-30.istio-system.svc:15012", "serverName: istiod-1-30.istio-system.svc"}},
		{name: "standalone, no istiod", vals: map[string]any{"istiod": map[string]any{"enabled": false}},
			wants: []string{"kind: ClusterRoleBinding\nmetadata:\n  name: embark-onboarding-endpoint-mesh-config"},
			nots:  []string{"istiod:", "istio-ca-root-cert", "/etc/istio-root"}},
		{name: "istiod at an explicit address, standalone translation", vals: map[string]any{"istiod": map[string]any{"address": "istiod.mesh.svc:15012", "relayXDS": false}},
			wants: []string{"address: istiod.mesh.svc:15012", "serverName: istiod.mesh.svc", "relayXDS: false", "name: istio-ca-root-cert", "kind: ClusterRoleBinding\nmetadata:\n  name: embark-onboarding-endpoint-mesh-config"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := Render(chartDir, "embark", "istio-system", tc.vals)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.wants {
				if !strings.Contains(out, w) {
					t.Errorf("rendered chart lacks %q", w)
				}
			}
			for _, n := range tc.nots {
				if strings.Contains(out, n) {
					t.Errorf("rendered chart has %q", n)
				}
			}
		})
	}
}

// A configuration change changes the Pod template's checksum annotation,
// so the Deployment rolls; an unrelated value does not.
func TestConfigChecksumRollsPods(t *testing.T) {
	checksum := func(vals map[string]any) string {
		t.Helper()
		out, err := Render(chartDir, "embark", "istio-system", vals)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(out, "\n") {
			if s, ok := strings.CutPrefix(strings.TrimSpace(l), "checksum/config: "); ok {
				return s
			}
		}
		t.Fatal("no checksum/config annotation")
		return ""
	}
	base := checksum(nil)
	if got := checksum(map[string]any{"registration": map[string]any{"gracePeriod": "10m"}}); got == base {
		t.Error("changing registration.gracePeriod left the checksum as it was")
	}
	if got := checksum(map[string]any{"replicas": 3}); got != base {
		t.Error("changing replicas changed the configuration checksum")
	}
}

// version is the repository's release version (its VERSION file): the
// chart's appVersion, the default image tag.
func version(t *testing.T) string {
	t.Helper()
	v, err := os.ReadFile("../../../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(v))
}
