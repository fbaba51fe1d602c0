package translate

import (
	"errors"
	"strings"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"sigs.k8s.io/yaml"

	metav1alpha1 "istio.io/api/meta/v1alpha1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
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

func TestParseHostForm(t *testing.T) {
	tests := []struct {
		in      string
		want    HostForm
		wantErr bool
	}{
		{in: "./*", want: HostForm{".", "*"}},
		{in: "bookinfo/*", want: HostForm{"bookinfo", "*"}},
		{in: "*/details.bookinfo.svc.cluster.local", want: HostForm{"*", "details.bookinfo.svc.cluster.local"}},
		{in: "~/*", want: HostForm{"~", "*"}},
		{in: "*/*", want: HostForm{"*", "*"}},
		{in: "./Example.ORG", want: HostForm{".", "example.org"}},
		{in: "*/*.example.com", want: HostForm{"*", "*.example.com"}},
		{in: "details", wantErr: true},
		{in: "/*", wantErr: true},
		{in: "./", wantErr: true},
		{in: "Bad_NS/*", wantErr: true},
		{in: "./a*b.com", wantErr: true},
		{in: "./-bad.com", wantErr: true},
		{in: "./*.*", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseHostForm(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if !tt.wantErr && got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestHostFormMatches(t *testing.T) {
	tests := []struct {
		form, host, ns string
		want           bool
	}{
		{"./*", "a.bookinfo.svc.cluster.local", "bookinfo", true},
		{"./*", "a.shop.svc.cluster.local", "shop", false},
		{"shop/*", "a.shop.svc.cluster.local", "shop", true},
		{"~/*", "a.bookinfo.svc.cluster.local", "bookinfo", false},
		{"*/example.org", "example.org", "any", true},
		{"*/example.org", "www.example.org", "any", false},
		{"*/*.example.org", "www.example.org", "any", true},
		{"*/*.example.org", "example.org", "any", false},
	}
	for _, tt := range tests {
		f, err := ParseHostForm(tt.form)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.matches(tt.host, tt.ns, "bookinfo"); got != tt.want {
			t.Errorf("%s matches %s in %s = %v, want %v", tt.form, tt.host, tt.ns, got, tt.want)
		}
	}
}

func TestExportedTo(t *testing.T) {
	tests := []struct {
		exportTo    []string
		objNS, wlNS string
		want        bool
	}{
		{nil, "a", "b", true},
		{[]string{"*"}, "a", "b", true},
		{[]string{"."}, "a", "a", true},
		{[]string{"."}, "a", "b", false},
		{[]string{"~"}, "a", "a", false},
		{[]string{"x", " b"}, "a", "b", true},
	}
	for _, tt := range tests {
		if got := exportedTo(tt.exportTo, tt.objNS, tt.wlNS); got != tt.want {
			t.Errorf("exportedTo(%v, %s, %s) = %v, want %v", tt.exportTo, tt.objNS, tt.wlNS, got, tt.want)
		}
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
	res.Clusters = append(res.Clusters, baseCluster("", 0))
	if err := res.Validate(); err == nil || !strings.Contains(err.Error(), "Name") {
		t.Errorf("Validate of a nameless cluster = %v, want a Name error", err)
	}
}

func TestWorkloadEntryHealth(t *testing.T) {
	tests := []struct {
		name        string
		annotations map[string]string
		condition   string // "" means no Healthy condition
		want        bool
	}{
		{name: "no condition", want: true},
		{name: "healthy", condition: "True", want: true},
		{name: "unhealthy", condition: "False", want: false},
		{name: "checks enabled, not reported yet", annotations: map[string]string{HealthChecksAnnotation: "true"}, want: false},
		{name: "checks enabled, healthy", annotations: map[string]string{HealthChecksAnnotation: "true"}, condition: "True", want: true},
		{name: "checks enabled, unhealthy", annotations: map[string]string{HealthChecksAnnotation: "true"}, condition: "False", want: false},
		{name: "checks disabled explicitly", annotations: map[string]string{HealthChecksAnnotation: "false"}, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			we := &istionetworkingv1.WorkloadEntry{}
			we.Annotations = tt.annotations
			if tt.condition != "" {
				we.Status.Conditions = append(we.Status.Conditions, &metav1alpha1.IstioCondition{Type: HealthyCondition, Status: tt.condition})
			}
			if got := weHealthy(we); got != tt.want {
				t.Errorf("weHealthy = %v, want %v", got, tt.want)
			}
		})
	}
}
