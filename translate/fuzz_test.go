package translate

import (
	"bytes"
	"os"
	"testing"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istiosecurityv1 "istio.io/client-go/pkg/apis/security/v1"
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
		_ = form.Matches("details.bookinfo.svc.cluster.local", "bookinfo", "bookinfo")
	})
}

// FuzzTranslateSidecar translates a fuzzed Sidecar against the bookinfo
// golden inputs: it must never panic, the scope's shared translation
// (Prepare, For) gives the workload and another one of its scope the same
// result or error as Translate, OwnInputs are deterministic, and whenever
// it succeeds every resource passes ValidateAll.
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
	// An egress listener without a port on another workload's address,
	// where its ingress listener is: the ingress keeps the port.
	f.Add([]byte("spec: {ingress: [{port: {number: 8080, protocol: HTTP}, defaultEndpoint: '127.0.0.1:8080'}], egress: [{bind: '10.9.9.9', hosts: ['./*']}]}"))
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
		// The scope's shared translation gives the workload the same.
		prepared := Prepare(&fuzzed)
		shared, _, sharedErr := prepared.For(fuzzed.Workload)
		if want, got := render(t, res, err), render(t, shared, sharedErr); !bytes.Equal(got, want) {
			t.Fatalf("Prepare+For of %q differs from Translate:\n%s\nwant:\n%s", doc, got, want)
		}
		// And another workload, on an address the Sidecar binds to when it
		// names one, what Translate gives it, from this scope when it is of
		// it.
		other := fuzzed
		other.Workload.Name, other.Workload.Address = "other", "10.9.9.9"
		for _, eg := range sc.Spec.GetEgress() {
			if eg.GetBind() != "" {
				other.Workload.Address = eg.GetBind()
				break
			}
		}
		scope := prepared
		if ScopeKey(&other) != ScopeKey(&fuzzed) {
			scope = Prepare(&other)
		}
		res2, err2 := Translate(&other)
		shared, _, sharedErr = scope.For(other.Workload)
		if want, got := render(t, res2, err2), render(t, shared, sharedErr); !bytes.Equal(got, want) {
			t.Fatalf("Prepare+For of %q for %s differs from Translate:\n%s\nwant:\n%s", doc, other.Workload.Address, got, want)
		}
		// OwnInputs are deterministic.
		a, okA := prepared.OwnInputs(fuzzed.Workload)
		b, okB := Prepare(&fuzzed).OwnInputs(fuzzed.Workload)
		if !okA || !okB || !a.Equal(b) {
			t.Fatalf("OwnInputs of %q: two Prepares of the same inputs differ (taken: %v, %v)", doc, okA, okB)
		}
		if err != nil {
			return
		}
		if err := res.Validate(); err != nil {
			t.Fatalf("valid translation of %q fails validation: %v", doc, err)
		}
	})
}

// FuzzTranslateAuthorizationPolicy translates a fuzzed AuthorizationPolicy
// selecting the example ratings VM: it must never panic, every successful
// translation validates, and a policy it cannot enforce always leaves every
// ingress chain refusing all traffic.
func FuzzTranslateAuthorizationPolicy(f *testing.F) {
	for _, s := range []string{
		"spec: {}",
		"spec: {action: DENY, rules: [{from: [{source: {namespaces: [legacy]}}]}]}",
		"spec: {rules: [{to: [{operation: {ports: ['8080'], methods: [GET], paths: ['/api*', '*.json', '*']}}]}]}",
		"spec: {rules: [{from: [{source: {principals: ['*', 'a*', '*b', 'cluster.local/ns/x/sa/y'], notPrincipals: ['*/sa/z']}}]}]}",
		"spec: {action: CUSTOM, provider: {name: ext}}",
		"spec: {rules: [{when: [{key: 'request.headers[x]', values: [y]}]}]}",
		"spec: {rules: [{to: [{operation: {ports: ['0', '70000', 'x'], paths: ['/a*b*']}}]}]}",
	} {
		f.Add([]byte(s))
	}
	base, err := os.ReadFile("testdata/seed004-bookinfo.input.yaml")
	if err != nil {
		f.Fatal(err)
	}
	in, err := parseInputs(base)
	if err != nil {
		f.Fatal(err)
	}
	seed, err := os.ReadFile("../api/crds/testdata/seed004/sidecar.yaml")
	if err != nil {
		f.Fatal(err)
	}
	sc := &istionetworkingv1.Sidecar{}
	if err := yaml.Unmarshal(seed, sc); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		ap := &istiosecurityv1.AuthorizationPolicy{}
		if err := yaml.Unmarshal(doc, ap); err != nil {
			return
		}
		ap.Namespace, ap.Name = in.Workload.Namespace, "fuzzed"
		ap.Spec.Selector, ap.Spec.TargetRef, ap.Spec.TargetRefs = nil, nil, nil
		fuzzed := *in
		fuzzed.Sidecars = []*istionetworkingv1.Sidecar{sc}
		fuzzed.AuthorizationPolicies = []*istiosecurityv1.AuthorizationPolicy{ap}
		res, err := Translate(&fuzzed)
		if err != nil {
			t.Fatalf("a policy made translation fail: %v", err)
		}
		if err := res.Validate(); err != nil {
			t.Fatalf("translation of %q fails validation: %v", doc, err)
		}
		if len(res.Unenforced) > 0 {
			for port, rbac := range chainRBAC(t, res) {
				if s := summary(rbac); len(s) != 1 || s[0] != "refuse-all" {
					t.Fatalf("unenforced policy %q: port %d chain RBAC %v, want refuse-all", doc, port, s)
				}
			}
		}
	})
}
