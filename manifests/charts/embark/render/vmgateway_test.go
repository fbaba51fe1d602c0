package main

import (
	"strings"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"
)

// object is the part of a rendered object these tests read.
type object struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec map[string]any `json:"spec"`
}

// objects renders the chart with vals and returns its objects by
// "<kind>/<name>".
func objects(t *testing.T, vals map[string]any) map[string]object {
	t.Helper()
	out, err := Render(chartDir, "embark", "istio-system", vals)
	if err != nil {
		t.Fatal(err)
	}
	objs := map[string]object{}
	for _, doc := range strings.Split(out, "\n---\n") {
		var o object
		if err := sigsyaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("rendered document does not parse: %v\n%s", err, doc)
		}
		if o.Kind != "" {
			key := o.Kind + "/" + o.Metadata.Name
			if _, dup := objs[key]; dup {
				t.Errorf("%s rendered twice", key)
			}
			objs[key] = o
		}
	}
	return objs
}

// portsOf returns a Service's ports as "port->targetPort" by name.
func portsOf(o object) map[string]string {
	out := map[string]string{}
	ports, _ := o.Spec["ports"].([]any)
	for _, p := range ports {
		m := p.(map[string]any)
		out[m["name"].(string)] = strings.TrimSpace(sigsString(m["port"]) + "->" + sigsString(m["targetPort"]))
	}
	return out
}

func sigsString(v any) string {
	b, _ := sigsyaml.Marshal(v)
	return strings.TrimSpace(string(b))
}

// One value, vmgateway.network, makes vmgateway the east-west gateway's
// Service labelled with the pods' network (what istiod discovers a network
// gateway by: the label and a 15443 port), with Istio's SNI
// auto-passthrough for *.local and Embark's hosts passed through to a
// ClusterIP Service of Embark's Pods on the ports the routes name. Without
// it vmgateway stays Embark's own Service and no Istio object renders.
func TestVMGatewayNetwork(t *testing.T) {
	single := objects(t, nil)
	if sel := sigsString(single["Service/vmgateway"].Spec["selector"]); sel != "app.kubernetes.io/instance: embark\napp.kubernetes.io/name: onboarding-endpoint" {
		t.Errorf("single network: vmgateway selects %q, want Embark's Pods", sel)
	}
	for _, k := range []string{"Gateway/vmgateway", "VirtualService/onboarding-endpoint", "Service/onboarding-endpoint"} {
		if _, ok := single[k]; ok {
			t.Errorf("single network: %s rendered", k)
		}
	}
	if _, ok := single["Service/vmgateway"].Metadata.Labels["topology.istio.io/network"]; ok {
		t.Error("single network: vmgateway carries a network label, which would make istiod treat it as a network gateway")
	}

	multi := objects(t, map[string]any{"vmgateway": map[string]any{"network": "kube-network"},
		"hosts": []any{"onboarding.mesh.example.com"}})
	gw := multi["Service/vmgateway"]
	if got := gw.Metadata.Labels["topology.istio.io/network"]; got != "kube-network" {
		t.Errorf("vmgateway network label %q, want kube-network", got)
	}
	if sel := sigsString(gw.Spec["selector"]); sel != "istio: eastwestgateway" {
		t.Errorf("vmgateway selects %q, want the east-west gateway's Pods", sel)
	}
	wantGW := map[string]string{"tls": "15443->15443", "tls-xds": "15012->15012", "status-port": "15021->15021"}
	if got := portsOf(gw); sigsString(got) != sigsString(wantGW) {
		t.Errorf("vmgateway ports %v, want %v", got, wantGW)
	}
	embark := multi["Service/onboarding-endpoint"]
	if embark.Spec["type"] != "ClusterIP" || sigsString(embark.Spec["selector"]) != "app.kubernetes.io/instance: embark\napp.kubernetes.io/name: onboarding-endpoint" {
		t.Errorf("Embark's Service: %v, want a ClusterIP Service of Embark's Pods", embark.Spec)
	}
	wantEmbark := map[string]string{"tls-onboard": "15443->grpc-onboard", "tls-xds": "15012->grpc-xds"}
	if got := portsOf(embark); sigsString(got) != sigsString(wantEmbark) {
		t.Errorf("Embark's Service ports %v, want %v", got, wantEmbark)
	}

	wantServers := `- hosts:
  - '*.local'
  port:
    name: tls-mesh
    number: 15443
    protocol: TLS
  tls:
    mode: AUTO_PASSTHROUGH
- hosts:
  - onboarding.mesh.example.com
  port:
    name: tls-onboarding
    number: 15443
    protocol: TLS
  tls:
    mode: PASSTHROUGH
- hosts:
  - onboarding.mesh.example.com
  port:
    name: tls-xds
    number: 15012
    protocol: TLS
  tls:
    mode: PASSTHROUGH`
	if got := sigsString(multi["Gateway/vmgateway"].Spec["servers"]); got != wantServers {
		t.Errorf("Gateway servers:\n%s\nwant:\n%s", got, wantServers)
	}
	wantRoutes := `- match:
  - port: 15443
    sniHosts:
    - onboarding.mesh.example.com
  route:
  - destination:
      host: onboarding-endpoint.istio-system.svc.cluster.local
      port:
        number: 15443
- match:
  - port: 15012
    sniHosts:
    - onboarding.mesh.example.com
  route:
  - destination:
      host: onboarding-endpoint.istio-system.svc.cluster.local
      port:
        number: 15012`
	if got := sigsString(multi["VirtualService/onboarding-endpoint"].Spec["tls"]); got != wantRoutes {
		t.Errorf("VirtualService tls routes:\n%s\nwant:\n%s", got, wantRoutes)
	}

	testVMGatewayRepositoryAndRevision(t)

	// The endpoint checks registrations against the mesh's networks.
	checkRender(t, map[string]any{"vmgateway": map[string]any{"network": "kube-network", "podCIDRs": []any{"10.244.0.0/16"}, "gatewayNetworks": []any{"vms"}}},
		[]string{"  network:\n        pods: kube-network\n        podCIDRs:\n          - 10.244.0.0/16\n        gateways:\n          - vms\n"}, nil, "")
	checkRender(t, nil, nil, []string{"pods: "}, "")
}

// Wrong multi-network values are refused with a message naming the value.
func TestVMGatewayNetworkRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		name    string
		vals    map[string]any
		wantErr string
	}{
		{name: "host in .local", vals: map[string]any{"vmgateway": map[string]any{"network": "kube-network"}, "hosts": []any{"onboarding.cluster.local"}}, wantErr: "hosts: onboarding.cluster.local ends in .local"},
		{name: "network not a label value", vals: map[string]any{"vmgateway": map[string]any{"network": "kube network"}}, wantErr: "network"},
		{name: "no gateway selector", vals: map[string]any{"vmgateway": map[string]any{"network": "n", "gatewaySelector": nil}}, wantErr: "gatewaySelector"},
		{name: "pod CIDR not a CIDR", vals: map[string]any{"vmgateway": map[string]any{"network": "n", "podCIDRs": []any{"10.244.0.1"}}}, wantErr: "podCIDRs"},
		{name: "misspelt key", vals: map[string]any{"vmgateway": map[string]any{"networks": "n"}}, wantErr: "networks"},
		{name: "internet-facing without source ranges", vals: map[string]any{"vmgateway": map[string]any{"network": "n"}, "service": map[string]any{"internal": false}}, wantErr: "loadBalancerSourceRanges"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkRender(t, tc.vals, nil, nil, tc.wantErr)
		})
	}
}

// testVMGatewayRepositoryAndRevision: with the local repository on, 443 on
// vmgateway reaches the gateway's own 443 listener, which passes the
// endpoint's hosts through to the repository's HTTPS port (never the gRPC
// port: the same DNS name on another port); off, nothing listens on 443. With
// a revision, every object of the wiring carries its suffix, so two releases
// install side by side.
func testVMGatewayRepositoryAndRevision(t *testing.T) {
	t.Helper()
	objs := objects(t, map[string]any{"vmgateway": map[string]any{"network": "kube-network"},
		"hosts": []any{"onboarding.mesh.example.com"}, "istiodRevision": "canary",
		"localRepository": map[string]any{"enabled": true, "signingKey": map[string]any{"secretName": "repo-key"}}})
	for _, k := range []string{"Service/vmgateway-canary", "Service/onboarding-endpoint-canary", "Gateway/vmgateway-canary", "VirtualService/onboarding-endpoint-canary"} {
		if _, ok := objs[k]; !ok {
			t.Errorf("revision canary: %s not rendered", k)
		}
	}
	if got := portsOf(objs["Service/vmgateway-canary"])["tls-repository"]; got != "443->443" {
		t.Errorf("vmgateway tls-repository %q, want 443->443 (the gateway's repository listener)", got)
	}
	if got := portsOf(objs["Service/onboarding-endpoint-canary"])["tls-repository"]; got != "443->https-repo" {
		t.Errorf("Embark's Service tls-repository %q, want 443->https-repo", got)
	}
	vs := objs["VirtualService/onboarding-endpoint-canary"]
	if got := sigsString(vs.Spec["gateways"]); got != "- vmgateway-canary" {
		t.Errorf("VirtualService gateways %s, want vmgateway-canary", got)
	}
	routes := sigsString(vs.Spec["tls"])
	want := `- match:
  - port: 443
    sniHosts:
    - onboarding.mesh.example.com
  route:
  - destination:
      host: onboarding-endpoint-canary.istio-system.svc.cluster.local
      port:
        number: 443`
	if !strings.Contains(routes, want) {
		t.Errorf("VirtualService tls routes:\n%s\nwant them to hold:\n%s", routes, want)
	}
	if servers := sigsString(objs["Gateway/vmgateway-canary"].Spec["servers"]); !strings.Contains(servers, "name: tls-repository\n    number: 443") {
		t.Errorf("Gateway servers have no 443 repository server:\n%s", servers)
	}
}
