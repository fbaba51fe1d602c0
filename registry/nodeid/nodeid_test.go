package nodeid

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		name    string
		id      string
		want    ID
		wantErr string
	}{
		{name: "EC2 registration", id: "sidecar~10.0.0.1~ratings-aws-aws-1-us-east-2b-ec2-i-1.bookinfo~bookinfo.svc.cluster.local",
			want: ID{IP: "10.0.0.1", Registration: types.NamespacedName{Namespace: "bookinfo", Name: "ratings-aws-aws-1-us-east-2b-ec2-i-1"}}},
		{name: "dotted WorkloadGroup", id: "sidecar~10.0.0.1~ratings.v1-aws-x.bookinfo~bookinfo.svc.cluster.local",
			want: ID{IP: "10.0.0.1", Registration: types.NamespacedName{Namespace: "bookinfo", Name: "ratings.v1-aws-x"}}},
		{name: "dotted JWT subject", id: "sidecar~10.0.0.1~web-jwt-corp-vm-01.example.com.ns~ns.svc.cluster.local",
			want: ID{IP: "10.0.0.1", Registration: types.NamespacedName{Namespace: "ns", Name: "web-jwt-corp-vm-01.example.com"}}},
		{name: "name ending like the namespace", id: "sidecar~fd00::1~a.ns.ns~ns.svc.example.org",
			want: ID{IP: "fd00::1", Registration: types.NamespacedName{Namespace: "ns", Name: "a.ns"}}},
		{name: "router", id: "router~10.0.0.1~a.ns~ns.svc.cluster.local", wantErr: "type"},
		{name: "name of another namespace", id: "sidecar~10.0.0.1~a.b~c.svc.cluster.local", wantErr: "is not <registration>.c"},
		{name: "no name", id: "sidecar~10.0.0.1~.ns~ns.svc.cluster.local", wantErr: "is not <registration>.ns"},
		{name: "no svc", id: "sidecar~10.0.0.1~a.ns~ns", wantErr: "DNS domain"},
		{name: "no address", id: "sidecar~~a.ns~ns.svc.cluster.local", wantErr: "no address"},
		{name: "five fields", id: "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local~x", wantErr: "want sidecar~"},
		{name: "uppercase name", id: "sidecar~10.0.0.1~A.ns~ns.svc.cluster.local", wantErr: "registration name"},
		{name: "namespace with a bad character", id: "sidecar~10.0.0.1~a.n_s~n_s.svc.cluster.local", wantErr: "namespace"},
		{name: "empty", id: "", wantErr: "want sidecar~"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.id)
			if tt.wantErr != "" {
				if err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse(%q) = %+v, %v; want an error mentioning %q", tt.id, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Parse(%q) = %+v, %v; want %+v", tt.id, got, err, tt.want)
			}
		})
	}
}

// FuzzRoundTrip: whatever Build makes of a valid registration, Parse gives
// back; whatever Parse accepts names one registration, and Build writes the
// same ID back (up to the DNS domain).
func FuzzRoundTrip(f *testing.F) {
	for _, seed := range [][3]string{
		{"10.0.0.1", "ratings-aws-aws-123456789012-us-east-2b-ec2-i-1", "bookinfo"},
		{"10.0.0.1", "ratings.v1-jwt-corp-vm-01.example.com", "bookinfo"},
		{"fd00::1", "a.ns", "ns"},
		{"2001:db8::20", "x", "ns-ns"},
		{"", "a", "b"},
		{"1.2.3.4", "a~b", "c"},
		{"1.2.3.4", "a", "c.d"},
	} {
		f.Add(seed[0], seed[1], seed[2], Build(seed[0], types.NamespacedName{Namespace: seed[2], Name: seed[1]}))
	}
	f.Add("", "", "", "sidecar~10.0.0.1~a.b.c~b.svc.cluster.local")
	f.Add("", "", "", "sidecar~~.~")
	f.Fuzz(func(t *testing.T, ip, name, ns, raw string) {
		reg := types.NamespacedName{Namespace: ns, Name: name}
		valid := ip != "" && !strings.Contains(ip, "~") &&
			len(validation.IsDNS1123Subdomain(name)) == 0 && len(validation.IsDNS1123Label(ns)) == 0
		got, err := Parse(Build(ip, reg))
		switch {
		case valid && err != nil:
			t.Fatalf("Parse(Build(%q, %v)): %v", ip, reg, err)
		case valid && (got.IP != ip || got.Registration != reg):
			t.Fatalf("Parse(Build(%q, %v)) = %+v", ip, reg, got)
		}

		id, err := Parse(raw)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Parse(%q): %v does not wrap ErrMalformed", raw, err)
			}
			return
		}
		if len(validation.IsDNS1123Subdomain(id.Registration.Name)) > 0 || len(validation.IsDNS1123Label(id.Registration.Namespace)) > 0 {
			t.Fatalf("Parse(%q) accepted invalid names %+v", raw, id.Registration)
		}
		prefix, _, _ := strings.Cut(id.String(), ".svc.")
		if !strings.HasPrefix(raw, prefix+".svc.") {
			t.Fatalf("Parse(%q) = %+v, which Build writes as %q", raw, id, id.String())
		}
	})
}

// A gateway's node ID has the router type and the pod's name and namespace
// where a sidecar's has the registration's; Parse, which reads sidecars'
// only, refuses it.
func TestBuildRouter(t *testing.T) {
	id := BuildRouter("10.244.0.20", types.NamespacedName{Namespace: "istio-system", Name: "istio-eastwestgateway-7d9f8-x2v4k"})
	if want := "router~10.244.0.20~istio-eastwestgateway-7d9f8-x2v4k.istio-system~istio-system.svc.cluster.local"; id != want {
		t.Errorf("BuildRouter() = %q, want %q", id, want)
	}
	if _, err := Parse(id); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "type") {
		t.Errorf("Parse(%q) = %v, want a malformed type", id, err)
	}
}
