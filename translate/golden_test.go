package translate

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/encoding/protojson"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istiosecurityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"

	"github.com/embark-mesh/embark/translate/endpoints"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/ from the current output")

// testWorkload is the test-only "kind: Workload" document of an input file.
type testWorkload struct {
	Kind           string            `json:"kind"`
	Name           string            `json:"name"`
	Namespace      string            `json:"namespace"`
	Address        string            `json:"address"`
	Labels         map[string]string `json:"labels"`
	ServiceAccount string            `json:"serviceAccount"`
	RootNamespace  string            `json:"rootNamespace"`
	TrustDomain    string            `json:"trustDomain"`
}

// parseInputs reads a multi-document YAML file of Kubernetes and Istio
// objects plus one "kind: Workload" document.
func parseInputs(data []byte) (*Inputs, error) {
	in := &Inputs{}
	for i, doc := range bytes.Split(data, []byte("\n---")) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var head struct{ Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		var err error
		switch head.Kind {
		case "":
			continue // comment-only document
		case "Workload":
			var w testWorkload
			err = yaml.UnmarshalStrict(doc, &w)
			in.Workload = Workload{Name: w.Name, Namespace: w.Namespace, Address: w.Address, Labels: w.Labels, ServiceAccount: w.ServiceAccount}
			in.RootNamespace = w.RootNamespace
			in.Mesh.TrustDomain = w.TrustDomain
		case "Sidecar":
			o := &istionetworkingv1.Sidecar{}
			err = yaml.Unmarshal(doc, o)
			in.Sidecars = append(in.Sidecars, o)
		case "Service":
			o := &corev1.Service{}
			err = yaml.Unmarshal(doc, o)
			in.Services = append(in.Services, o)
		case "EndpointSlice":
			o := &discoveryv1.EndpointSlice{}
			err = yaml.Unmarshal(doc, o)
			in.EndpointSlices = append(in.EndpointSlices, o)
		case "ServiceEntry":
			o := &istionetworkingv1.ServiceEntry{}
			err = yaml.Unmarshal(doc, o)
			in.ServiceEntries = append(in.ServiceEntries, o)
		case "WorkloadEntry":
			o := &istionetworkingv1.WorkloadEntry{}
			err = yaml.Unmarshal(doc, o)
			in.WorkloadEntries = append(in.WorkloadEntries, o)
		case "PeerAuthentication":
			o := &istiosecurityv1.PeerAuthentication{}
			err = yaml.Unmarshal(doc, o)
			in.PeerAuthentications = append(in.PeerAuthentications, o)
		case "AuthorizationPolicy":
			o := &istiosecurityv1.AuthorizationPolicy{}
			err = yaml.Unmarshal(doc, o)
			in.AuthorizationPolicies = append(in.AuthorizationPolicies, o)
		case "RequestAuthentication":
			o := &istiosecurityv1.RequestAuthentication{}
			err = yaml.Unmarshal(doc, o)
			in.RequestAuthentications = append(in.RequestAuthentications, o)
		case "Pod":
			o := &corev1.Pod{}
			err = yaml.Unmarshal(doc, o)
			in.Pods = append(in.Pods, o)
		default:
			return nil, fmt.Errorf("document %d: unexpected kind %q", i, head.Kind)
		}
		if err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i, head.Kind, err)
		}
	}
	return in, nil
}

// renderResult is the stable JSON form of a result the golden files hold.
func renderResult(res *Result) ([]byte, error) {
	out := map[string]any{}
	if res.Sidecar != nil {
		out["sidecar"] = res.Sidecar.Namespace + "/" + res.Sidecar.Name
	}
	out["warnings"] = append([]string{}, res.Warnings...)
	if len(res.Unenforced) > 0 {
		var u []string
		for _, p := range res.Unenforced {
			u = append(u, p.String())
		}
		out["unenforced"] = u
	}
	for key, group := range map[string][]types.Resource{"listeners": res.Listeners, "routes": res.Routes, "clusters": res.Clusters, "endpoints": res.Endpoints} {
		list := []json.RawMessage{}
		for _, r := range group {
			b, err := protojson.Marshal(r)
			if err != nil {
				return nil, err
			}
			list = append(list, b)
		}
		out[key] = list
	}
	compact, err := json.Marshal(out) // sorted keys; protojson's random spacing dropped below
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, compactJSON(compact), "", "  "); err != nil {
		return nil, err
	}
	buf.WriteByte('\n')
	return buf.Bytes(), nil
}

func compactJSON(b []byte) []byte {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return b
	}
	return buf.Bytes()
}

func TestGolden(t *testing.T) {
	inputs, err := filepath.Glob("testdata/*.input.yaml")
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no golden inputs: %v", err)
	}
	for _, path := range inputs {
		name := strings.TrimSuffix(filepath.Base(path), ".input.yaml")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			// "# include: <path>" lines pull in shared inputs such as the
			// example Sidecar under api/crds/testdata/seed004.
			for _, line := range strings.Split(string(data), "\n") {
				if inc, ok := strings.CutPrefix(line, "# include: "); ok {
					extra, err := os.ReadFile(filepath.FromSlash(strings.TrimSpace(inc)))
					if err != nil {
						t.Fatal(err)
					}
					data = append(append(extra, []byte("\n---\n")...), data...)
				}
			}
			in, err := parseInputs(data)
			if err != nil {
				t.Fatal(err)
			}
			res, err := Translate(in)
			if err != nil {
				t.Fatalf("Translate: %v", err)
			}
			if err := res.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			// The result is a consistent snapshot: every EDS cluster has its
			// endpoints and every RDS listener its route configuration.
			snap, err := cachev3.NewSnapshot("1", res.ByType())
			if err != nil {
				t.Fatal(err)
			}
			if err := snap.Consistent(); err != nil {
				t.Fatalf("snapshot not consistent: %v", err)
			}
			got, err := renderResult(res)
			if err != nil {
				t.Fatal(err)
			}
			// Translating again gives byte-identical output (no map order leaks).
			res2, _ := Translate(in)
			if again, _ := renderResult(res2); !bytes.Equal(got, again) {
				t.Fatal("two translations of the same inputs differ")
			}
			// So do translations sharing one endpoint index, the second
			// reading the endpoints the first remembered.
			shared := *in
			shared.Endpoints = endpoints.NewIndex(in.EndpointSlices, in.Pods, in.WorkloadEntries)
			for i := range 2 {
				r, _ := Translate(&shared)
				if again, _ := renderResult(r); !bytes.Equal(got, again) {
					t.Fatalf("translation %d with a shared endpoint index differs", i+1)
				}
			}
			golden := filepath.Join("testdata", name+".golden.json")
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./translate -run TestGolden -update)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from the translation; diff it with -update and git diff:\n%s", golden, firstDiff(want, got))
			}
		})
	}
}

func firstDiff(want, got []byte) string {
	wl, gl := strings.Split(string(want), "\n"), strings.Split(string(got), "\n")
	for i := 0; i < len(wl) || i < len(gl); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			return fmt.Sprintf("line %d:\n want %s\n got  %s", i+1, w, g)
		}
	}
	return ""
}
