package translate

import (
	"errors"
	"strings"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"sigs.k8s.io/yaml"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"

	"github.com/embark-mesh/embark/translate/internal/envoyconf"
)

func sidecarYAML(t *testing.T, spec string) *istionetworkingv1.Sidecar {
	t.Helper()
	sc := &istionetworkingv1.Sidecar{}
	if err := yaml.Unmarshal([]byte("metadata: {name: bad, namespace: shop}\nspec:\n"+spec), sc); err != nil {
		t.Fatal(err)
	}
	return sc
}

func TestSidecarErrors(t *testing.T) {
	tests := []struct {
		name, spec, wantField, wantReason string
	}{
		{"ingress without port", `
  ingress: [{defaultEndpoint: "127.0.0.1:80"}]`, "spec.ingress[0].port", "required"},
		{"ingress bad protocol", `
  ingress: [{port: {number: 80, protocol: UDP, name: x}, defaultEndpoint: "127.0.0.1:80"}]`, "spec.ingress[0].port.protocol", `"UDP"`},
		{"ingress port zero", `
  ingress: [{port: {number: 0, protocol: HTTP, name: x}, defaultEndpoint: "127.0.0.1:80"}]`, "spec.ingress[0].port.number", "not a port"},
		{"ingress without defaultEndpoint", `
  ingress: [{port: {number: 80, protocol: HTTP, name: x}}]`, "spec.ingress[0].defaultEndpoint", "required"},
		{"ingress defaultEndpoint hostname", `
  ingress: [{port: {number: 80, protocol: HTTP, name: x}, defaultEndpoint: "localhost:80"}]`, "spec.ingress[0].defaultEndpoint", "not an IP"},
		{"ingress defaultEndpoint relative unix", `
  ingress: [{port: {number: 80, protocol: HTTP, name: x}, defaultEndpoint: "unix://sock"}]`, "spec.ingress[0].defaultEndpoint", "absolute"},
		{"ingress bad bind", `
  ingress: [{port: {number: 80, protocol: HTTP, name: x}, bind: "nope", defaultEndpoint: "127.0.0.1:80"}]`, "spec.ingress[0].bind", "not an IP"},
		{"duplicate ingress ports", `
  ingress:
  - {port: {number: 80, protocol: HTTP, name: a}, defaultEndpoint: "127.0.0.1:80"}
  - {port: {number: 80, protocol: TCP, name: b}, defaultEndpoint: "127.0.0.1:81"}`, "spec.ingress[1]", "already used by spec.ingress[0]"},
		{"egress bad bind", `
  egress: [{bind: "300.0.0.1", port: {number: 80, protocol: HTTP, name: x}, hosts: ["./*"]}]`, "spec.egress[0].bind", "not an IP"},
		{"egress bind with zone", `
  egress: [{bind: "fe80::1%eth0", port: {number: 80, protocol: HTTP, name: x}, hosts: ["./*"]}]`, "spec.egress[0].bind", "not an IP"},
		{"egress without hosts", `
  egress: [{port: {number: 80, protocol: HTTP, name: x}}]`, "spec.egress[0].hosts", "required"},
		{"egress host without namespace", `
  egress: [{port: {number: 80, protocol: HTTP, name: x}, hosts: ["./*", "details"]}]`, "spec.egress[0].hosts[1]", "<namespace>/<dns name>"},
		{"egress bad protocol", `
  egress: [{port: {number: 80, protocol: "", name: x}, hosts: ["./*"]}]`, "spec.egress[0].port.protocol", "not one of"},
		{"duplicate egress ports", `
  egress:
  - {port: {number: 80, protocol: HTTP, name: a}, hosts: ["./*"]}
  - {port: {number: 80, protocol: HTTP, name: b}, hosts: ["*/*"]}`, "spec.egress[1]", "127.0.0.2:80 is already used by spec.egress[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := &Inputs{
				Workload: Workload{Namespace: "shop", Address: "10.0.0.1"},
				Sidecars: []*istionetworkingv1.Sidecar{sidecarYAML(t, tt.spec)},
			}
			res, err := Translate(in)
			if err == nil {
				t.Fatalf("no error; result %+v", res)
			}
			var se *SidecarError
			if !errors.As(err, &se) {
				t.Fatalf("error %v is not a *SidecarError", err)
			}
			if se.Sidecar != "shop/bad" || se.Field != tt.wantField || !strings.Contains(se.Reason, tt.wantReason) {
				t.Errorf("got %+v, want field %q and reason containing %q", se, tt.wantField, tt.wantReason)
			}
			if res != nil {
				t.Errorf("a result came with the error: %+v", res)
			}
		})
	}
}

func TestByTypeAndValidate(t *testing.T) {
	in := &Inputs{
		Workload: Workload{Namespace: "shop", Address: "10.0.0.1"},
		Sidecars: []*istionetworkingv1.Sidecar{sidecarYAML(t, `
  ingress: [{port: {number: 80, protocol: HTTP, name: x}, defaultEndpoint: "127.0.0.1:8080"}]`)},
	}
	res, err := Translate(in)
	if err != nil {
		t.Fatal(err)
	}
	byType := res.ByType()
	if len(byType[resource.ListenerType]) != 1 || len(byType[resource.ClusterType]) != 1 {
		t.Fatalf("ByType = %v", byType)
	}
	if err := res.Validate(); err != nil {
		t.Fatal(err)
	}
	// A resource Envoy would reject fails Validate.
	res.Clusters = append(res.Clusters, envoyconf.BaseCluster("", 0))
	if err := res.Validate(); err == nil || !strings.Contains(err.Error(), "Name") {
		t.Errorf("Validate of a nameless cluster = %v, want a Name error", err)
	}
}
