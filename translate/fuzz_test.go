package translate

import (
	"os"
	"testing"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"sigs.k8s.io/yaml"
)

func FuzzParseHostForm(f *testing.F) {
	for _, s := range []string{"./*", "ns/*", "*/details.bookinfo.svc.cluster.local", "~/*", "*/*", "*/*.example.com", "details", "/", "./", "a/b/c", "*/ex ample.org"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		form, err := ParseHostForm(s)
		if err != nil {
			return
		}
		// A parsed form round-trips and matching never panics.
		again, err := ParseHostForm(form.Namespace + "/" + form.Host)
		if err != nil || again != form {
			t.Fatalf("%q parsed to %+v, which reparses to %+v, %v", s, form, again, err)
		}
		_ = form.matches("details.bookinfo.svc.cluster.local", "bookinfo", "bookinfo")
	})
}

// FuzzTranslateSidecar translates a fuzzed Sidecar against the bookinfo
// golden inputs: it must never panic, and whenever it succeeds every
// resource passes ValidateAll.
func FuzzTranslateSidecar(f *testing.F) {
	seed, err := os.ReadFile("../api/crds/testdata/seed004/sidecar.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	for _, name := range []string{"hosts-forms", "protocols", "portless-egress"} {
		data, err := os.ReadFile("testdata/" + name + ".input.yaml")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("spec: {egress: [{port: {number: 1, protocol: tcp}, hosts: ['*/*']}], ingress: [{port: {number: 65535, protocol: grpc}, defaultEndpoint: '[::1]:1'}]}"))
	f.Add([]byte("spec: {egress: [{bind: '::1', hosts: ['~/*', './*']}]}"))
	base, err := os.ReadFile("testdata/seed004-bookinfo.input.yaml")
	if err != nil {
		f.Fatal(err)
	}
	in, err := parseInputs(base)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		sc := &istionetworkingv1.Sidecar{}
		if err := yaml.Unmarshal(doc, sc); err != nil {
			return
		}
		// Make it the workload's own namespace-wide Sidecar.
		sc.Namespace, sc.Name = in.Workload.Namespace, "fuzzed"
		sc.Spec.WorkloadSelector = nil
		fuzzed := *in
		fuzzed.Sidecars = []*istionetworkingv1.Sidecar{sc}
		res, err := Translate(&fuzzed)
		if err != nil {
			return
		}
		if err := res.Validate(); err != nil {
			t.Fatalf("valid translation of %q fails validation: %v", doc, err)
		}
	})
}
