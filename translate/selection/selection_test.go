package selection

import (
	"testing"
	"time"

	securityv1beta1 "istio.io/api/security/v1beta1"
	typev1beta1 "istio.io/api/type/v1beta1"
	istiosecurityv1 "istio.io/client-go/pkg/apis/security/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

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
		if got := f.Matches(tt.host, tt.ns, "bookinfo"); got != tt.want {
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
		if got := ExportedTo(tt.exportTo, tt.objNS, tt.wlNS); got != tt.want {
			t.Errorf("ExportedTo(%v, %s, %s) = %v, want %v", tt.exportTo, tt.objNS, tt.wlNS, got, tt.want)
		}
	}
}

func peerAuth(ns, name string, age int, sel map[string]string, mode securityv1beta1.PeerAuthentication_MutualTLS_Mode, ports map[uint32]securityv1beta1.PeerAuthentication_MutualTLS_Mode) *istiosecurityv1.PeerAuthentication {
	pa := &istiosecurityv1.PeerAuthentication{ObjectMeta: metav1.ObjectMeta{
		Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Minute)),
	}}
	pa.Spec.Mtls = &securityv1beta1.PeerAuthentication_MutualTLS{Mode: mode}
	if sel != nil {
		pa.Spec.Selector = &typev1beta1.WorkloadSelector{MatchLabels: sel}
	}
	for p, m := range ports {
		if pa.Spec.PortLevelMtls == nil {
			pa.Spec.PortLevelMtls = map[uint32]*securityv1beta1.PeerAuthentication_MutualTLS{}
		}
		pa.Spec.PortLevelMtls[p] = &securityv1beta1.PeerAuthentication_MutualTLS{Mode: m}
	}
	return pa
}

func TestPeerAuthMode(t *testing.T) {
	const (
		unset      = securityv1beta1.PeerAuthentication_MutualTLS_UNSET
		strict     = securityv1beta1.PeerAuthentication_MutualTLS_STRICT
		permissive = securityv1beta1.PeerAuthentication_MutualTLS_PERMISSIVE
		disable    = securityv1beta1.PeerAuthentication_MutualTLS_DISABLE
	)
	ns, labels := "shop", map[string]string{"app": "api"}
	sel := map[string]string{"app": "api"}
	tests := []struct {
		name string
		pas  []*istiosecurityv1.PeerAuthentication
		port uint32
		want MTLSMode
	}{
		{name: "default permissive", want: MTLSPermissive},
		{name: "mesh strict", pas: []*istiosecurityv1.PeerAuthentication{peerAuth("istio-system", "default", 0, nil, strict, nil)}, want: MTLSStrict},
		{name: "namespace overrides mesh", pas: []*istiosecurityv1.PeerAuthentication{
			peerAuth("istio-system", "default", 0, nil, strict, nil),
			peerAuth("shop", "default", 0, nil, permissive, nil),
		}, want: MTLSPermissive},
		{name: "namespace unset inherits mesh", pas: []*istiosecurityv1.PeerAuthentication{
			peerAuth("istio-system", "default", 0, nil, strict, nil),
			peerAuth("shop", "default", 0, nil, unset, nil),
		}, want: MTLSStrict},
		{name: "selector overrides namespace", pas: []*istiosecurityv1.PeerAuthentication{
			peerAuth("shop", "default", 0, nil, permissive, nil),
			peerAuth("shop", "api", 0, sel, strict, nil),
		}, want: MTLSStrict},
		{name: "port level beats workload level", port: 7000, pas: []*istiosecurityv1.PeerAuthentication{
			peerAuth("shop", "api", 0, sel, strict, map[uint32]securityv1beta1.PeerAuthentication_MutualTLS_Mode{7000: disable}),
		}, want: MTLSDisable},
		{name: "port level for another port", port: 8080, pas: []*istiosecurityv1.PeerAuthentication{
			peerAuth("shop", "api", 0, sel, strict, map[uint32]securityv1beta1.PeerAuthentication_MutualTLS_Mode{7000: disable}),
		}, want: MTLSStrict},
		{name: "selector that does not match", pas: []*istiosecurityv1.PeerAuthentication{
			peerAuth("shop", "web", 0, map[string]string{"app": "web"}, strict, nil),
		}, want: MTLSPermissive},
		{name: "selector in root namespace ignored", pas: []*istiosecurityv1.PeerAuthentication{
			peerAuth("istio-system", "api", 0, sel, strict, nil),
		}, want: MTLSPermissive},
		{name: "oldest selector wins", pas: []*istiosecurityv1.PeerAuthentication{
			peerAuth("shop", "new", 5, sel, strict, nil),
			peerAuth("shop", "old", 1, sel, disable, nil),
		}, want: MTLSDisable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := PeerAuthMode(tt.pas, ns, labels, "istio-system", tt.port); got != tt.want {
				t.Errorf("mode %s, want %s", got, tt.want)
			}
		})
	}
}
