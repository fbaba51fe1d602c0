package translate

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// variants are workloads to translate the inputs for: every combination of
// addresses (the input's own, every bind its Sidecars name, another one,
// IPv6, none, invalid) and labels (the input's own, none, each selector's).
func variants(in *Inputs) []Workload {
	addrs := map[string]bool{in.Workload.Address: true, "10.9.9.9": true, "fd00::9": true, "": true, "not-an-ip": true, "127.0.0.2": true}
	labelSets := []map[string]string{in.Workload.Labels, nil}
	for _, sc := range in.Sidecars {
		for _, ing := range sc.Spec.GetIngress() {
			addrs[ing.GetBind()] = true
		}
		for _, eg := range sc.Spec.GetEgress() {
			addrs[eg.GetBind()] = true
		}
		if l := sc.Spec.GetWorkloadSelector().GetLabels(); len(l) > 0 {
			labelSets = append(labelSets, l)
		}
	}
	for _, pa := range in.PeerAuthentications {
		if l := pa.Spec.GetSelector().GetMatchLabels(); len(l) > 0 {
			labelSets = append(labelSets, maps.Clone(l))
		}
	}
	for _, ap := range in.AuthorizationPolicies {
		if l := ap.Spec.GetSelector().GetMatchLabels(); len(l) > 0 {
			labelSets = append(labelSets, maps.Clone(l))
		}
	}
	var out []Workload
	i := 0
	for a := range addrs {
		for _, l := range labelSets {
			w := in.Workload
			w.Name = fmt.Sprintf("%s-%d", in.Workload.Name, i)
			w.Address, w.Labels = a, l
			out = append(out, w)
			i++
		}
	}
	return out
}

// render is a result or error in a comparable form.
func render(t *testing.T, res *Result, err error) []byte {
	t.Helper()
	if err != nil {
		return []byte("error: " + err.Error())
	}
	b, err := renderResult(res)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSharedEqualsTranslate proves that translating a scope once and
// applying each workload's own part gives, byte for byte, what translating
// each workload on its own gives: for every golden input and every Sidecar
// of the error table, for every pair of workload variants with the same
// ScopeKey (the scope prepared from one, applied to the other).
func TestSharedEqualsTranslate(t *testing.T) {
	paths, err := filepath.Glob("testdata/*.input.yaml")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no golden inputs: %v", err)
	}
	type testCase struct {
		name string
		in   *Inputs
	}
	var cases []testCase
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		in, err := parseInputs(data)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		cases = append(cases, testCase{strings.TrimSuffix(filepath.Base(path), ".input.yaml"), in})
	}
	for i, spec := range []string{
		`
  ingress: [{port: {number: 80, protocol: HTTP, name: a}, defaultEndpoint: "0.0.0.0:8080"}]
  egress: [{bind: 10.9.9.9, port: {number: 80, protocol: HTTP, name: x}, hosts: ["./*"]}]`,
		`
  ingress: [{port: {number: 80, protocol: HTTP, name: a}, bind: 10.9.9.9, defaultEndpoint: "127.0.0.1:80"}, {port: {number: 81, protocol: TCP, name: b}, defaultEndpoint: "127.0.0.1:81"}]
  egress: [{bind: 10.9.9.9, port: {number: 81, protocol: HTTP, name: x}, hosts: ["./*"]}, {port: {number: 80, protocol: "", name: yy}, hosts: ["./*"]}]`,
		`
  ingress: [{port: {number: 80, protocol: HTTP, name: a}, defaultEndpoint: "127.0.0.1:80"}]
  egress: [{bind: 127.0.0.2, hosts: ["./*"]}, {bind: 10.9.9.9, port: {number: 80, protocol: HTTP, name: b}, hosts: ["./*"]}, {bind: 10.9.9.9, port: {number: 80, protocol: HTTP, name: c}, hosts: ["./*"]}]`,
		`
  egress: [{bind: "300.0.0.1", port: {number: 80, protocol: HTTP, name: x}, hosts: ["./*"]}]`,
		`
  ingress: [{port: {number: 80, protocol: UDP, name: x}, defaultEndpoint: "127.0.0.1:80"}]`,
		// Egress listeners without a port on the workload's own address
		// or an ingress bind: the ingress listeners keep their ports.
		`
  ingress: [{port: {number: 8080, protocol: HTTP, name: a}, defaultEndpoint: "127.0.0.1:8080"}, {port: {number: 81, protocol: TCP, name: b}, bind: 10.9.9.8, defaultEndpoint: "127.0.0.1:81"}]
  egress: [{bind: 10.9.9.9, hosts: ["./*"]}, {bind: 10.9.9.8, hosts: ["./*"]}]`,
	} {
		in := &Inputs{
			Workload: Workload{Name: "w", Namespace: "shop", Address: "10.0.0.1", Labels: map[string]string{"app": "a"}},
			Sidecars: []*istionetworkingv1.Sidecar{sidecarYAML(t, spec)},
			Services: []*corev1.Service{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
				Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 8080}, {Name: "tcp", Port: 81}}}}},
		}
		cases = append(cases, testCase{fmt.Sprintf("sidecar-%d", i), in})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ws := variants(tc.in)
			byKey := map[string][]Workload{}
			for _, w := range ws {
				in := *tc.in
				in.Workload = w
				key := ScopeKey(&in)
				byKey[key] = append(byKey[key], w)
			}
			compared := 0
			for key, group := range byKey {
				want := make([][]byte, len(group))
				for i, w := range group {
					in := *tc.in
					in.Workload = w
					res, err := Translate(&in)
					want[i] = render(t, res, err)
				}
				for _, from := range group {
					in := *tc.in
					in.Workload = from
					shared := Prepare(&in)
					for i, w := range group {
						res, own, err := shared.For(w)
						got := render(t, res, err)
						if !bytes.Equal(want[i], got) {
							t.Fatalf("scope %q prepared for %+v, applied to %+v: differs from Translate at %s", key, from, w, firstDiff(want[i], got))
						}
						if err == nil {
							checkOwn(t, shared, res, own)
						}
						compared++
					}
				}
			}
			if len(byKey) == len(ws) {
				t.Errorf("no two of %d variants share a scope: the test compares nothing shared", len(ws))
			}
			t.Logf("%d variants, %d scopes, %d comparisons", len(ws), len(byKey), compared)
		})
	}
}

// checkOwn: the result is Common plus own, nothing else.
func checkOwn(t *testing.T, s *Shared, res, own *Result) {
	t.Helper()
	c := s.Common()
	if c == nil {
		t.Fatal("Common is nil for a scope that translated")
	}
	if got, want := len(res.Listeners)+len(res.Clusters), len(c.Listeners)+len(c.Clusters)+len(own.Listeners)+len(own.Clusters); got != want {
		t.Errorf("result has %d listeners and clusters, Common and own have %d", got, want)
	}
	if len(res.Routes) != len(c.Routes) || len(res.Endpoints) != len(c.Endpoints) || len(own.Routes)+len(own.Endpoints) != 0 {
		t.Errorf("routes or endpoints are not Common's")
	}
}

// TestForSharesIngressParts: the workloads of a scope get ingress
// listeners of their own (their own address) whose filter chains and TLS
// inspector are the scope's, and the scope's inbound clusters unless the
// defaultEndpoint stands for the workload's own address (0.0.0.0): all
// built once by Prepare, not once per workload, and listed by Parts.
func TestForSharesIngressParts(t *testing.T) {
	in := &Inputs{
		Workload: Workload{Name: "a", Namespace: "shop", Address: "10.0.0.1"},
		Sidecars: []*istionetworkingv1.Sidecar{sidecarYAML(t, `
  ingress:
  - {port: {number: 80, protocol: HTTP, name: http}, defaultEndpoint: "127.0.0.1:8080"}
  - {port: {number: 9000, protocol: TCP, name: tcp}, defaultEndpoint: "127.0.0.1:9000"}
  - {port: {number: 9100, protocol: TCP, name: own}, defaultEndpoint: "0.0.0.0:9100"}`)},
	}
	s := Prepare(in)
	chains, clusters := s.Parts()
	sharedChain := map[*listenerv3.FilterChain]bool{}
	for _, c := range chains {
		sharedChain[c] = true
	}
	sharedCluster := map[*clusterv3.Cluster]bool{}
	for _, c := range clusters {
		sharedCluster[c] = true
	}
	if len(sharedCluster) != 2 {
		t.Fatalf("Parts: %d inbound clusters, want the 2 whose defaultEndpoint is not 0.0.0.0", len(sharedCluster))
	}
	var mine []*Result
	for _, addr := range []string{"10.0.0.1", "10.0.0.2"} {
		w := in.Workload
		w.Address = addr
		_, own, err := s.For(w)
		if err != nil {
			t.Fatal(err)
		}
		if len(own.Listeners) != 3 || len(own.Clusters) != 3 {
			t.Fatalf("%s: %d ingress listeners and %d inbound clusters, want 3 and 3", addr, len(own.Listeners), len(own.Clusters))
		}
		for _, r := range own.Listeners {
			l := r.(*listenerv3.Listener)
			if l.GetAddress().GetSocketAddress().GetAddress() != addr {
				t.Errorf("%s: listener %s, want one on the workload's own address", addr, l.GetName())
			}
			for _, c := range l.GetFilterChains() {
				if !sharedChain[c] {
					t.Errorf("%s: listener %s chain %s built per workload, want the scope's", addr, l.GetName(), c.GetName())
				}
			}
		}
		for _, r := range own.Clusters {
			c := r.(*clusterv3.Cluster)
			own := c.GetName() == "inbound|9100||"
			if sharedCluster[c] == own {
				t.Errorf("%s: cluster %s shared = %v, want %v", addr, c.GetName(), sharedCluster[c], !own)
			}
			upstream := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetAddress()
			if own && upstream != addr {
				t.Errorf("%s: cluster %s forwards to %s, want the workload's own address", addr, c.GetName(), upstream)
			}
		}
		mine = append(mine, own)
	}
	a, b := mine[0].Listeners[0].(*listenerv3.Listener), mine[1].Listeners[0].(*listenerv3.Listener)
	if a.GetListenerFilters()[0] != b.GetListenerFilters()[0] {
		t.Errorf("TLS inspector built per workload, want the scope's")
	}
}
