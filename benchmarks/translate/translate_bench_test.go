package translate

import (
	"fmt"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/embark-mesh/embark/translate"
)

// inputs builds n Services over 10 namespaces, each with one HTTP port and
// an EndpointSlice of three ready pods, and a Sidecar for the workload with
// one ingress port and an HTTP egress "*/*" on the Services' port.
func inputs(n int) *translate.Inputs {
	in := &translate.Inputs{
		Workload: translate.Workload{Name: "vm", Namespace: "ns-0", Address: "10.0.0.10", Labels: map[string]string{"app": "vm"}},
		Sidecars: []*istionetworkingv1.Sidecar{{
			ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: "ns-0"},
			Spec: networkingv1alpha3.Sidecar{
				Ingress: []*networkingv1alpha3.IstioIngressListener{{
					Port:            &networkingv1alpha3.SidecarPort{Number: 8080, Protocol: "HTTP", Name: "http"},
					DefaultEndpoint: "127.0.0.1:8080",
				}},
				Egress: []*networkingv1alpha3.IstioEgressListener{{
					Port:  &networkingv1alpha3.SidecarPort{Number: 9080, Protocol: "HTTP", Name: "http"},
					Hosts: []string{"*/*"},
				}},
			},
		}},
	}
	for i := range n {
		ns, name := fmt.Sprintf("ns-%d", i%10), fmt.Sprintf("svc-%d", i)
		in.Services = append(in.Services, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 9080}}},
		})
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-x", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](9080)}},
		}
		for j := range 3 {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 1+i/250, i%250, j+1)},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			})
		}
		in.EndpointSlices = append(in.EndpointSlices, es)
	}
	return in
}

func allResources(res *translate.Result) []types.Resource {
	var all []types.Resource
	for _, g := range [][]types.Resource{res.Listeners, res.Routes, res.Clusters, res.Endpoints} {
		all = append(all, g...)
	}
	return all
}

func BenchmarkTranslate(b *testing.B) {
	for _, n := range []int{100, 1000} {
		in := inputs(n)
		res, err := translate.Translate(in)
		if err != nil {
			b.Fatal(err)
		}
		if err := res.Validate(); err != nil {
			b.Fatal(err)
		}
		if got := len(res.Clusters); got != n+1 {
			b.Fatalf("%d clusters, want %d", got, n+1)
		}
		all := allResources(res)

		// The baselines run first (testing.Benchmark cannot nest inside a
		// running benchmark), keeping their last ns/op for the ratios.
		var cloneNs, snapshotNs float64
		b.Run(fmt.Sprintf("services=%d/baseline=clone", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for _, r := range all {
					_ = proto.Clone(r)
				}
			}
			cloneNs = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		})
		b.Run(fmt.Sprintf("services=%d/baseline=snapshot", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s, err := cachev3.NewSnapshot("1", res.ByType())
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Consistent(); err != nil {
					b.Fatal(err)
				}
			}
			snapshotNs = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		})
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := translate.Translate(in); err != nil {
					b.Fatal(err)
				}
			}
			perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			if cloneNs > 0 && snapshotNs > 0 {
				b.ReportMetric(perOp/cloneNs, "x-clone")
				b.ReportMetric(perOp/snapshotNs, "x-snapshot")
			}
			b.ReportMetric(float64(len(all)), "resources")
		})
	}
}

// BenchmarkSharedFor is what one more workload of an already translated
// scope costs (translate.Shared.For: its ingress listener and inbound
// cluster, merged with the scope's resources), next to translating it on its
// own (translate.Translate), with the same Services.
func BenchmarkSharedFor(b *testing.B) {
	for _, n := range []int{100, 1000} {
		in := inputs(n)
		shared := translate.Prepare(in)
		w := in.Workload
		w.Name, w.Address = "vm-2", "10.0.0.11"
		b.Run(fmt.Sprintf("services=%d/for", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := shared.For(w); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("services=%d/baseline=translate", n), func(b *testing.B) {
			b.ReportAllocs()
			in := *in
			in.Workload = w
			for b.Loop() {
				if _, err := translate.Translate(&in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
