package endpoint

import (
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	meshconfig "istio.io/api/mesh/v1alpha1"
	istioapi "istio.io/api/networking/v1alpha3"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
)

// TestBootstrapCarriesTheProbe checks that every kind of WorkloadGroup probe
// survives the registration's snapshot and reaches the sidecar's
// PROXY_CONFIG as ProxyConfig.readinessProbe, the form pilot-agent runs.
func TestBootstrapCarriesTheProbe(t *testing.T) {
	timing := func(p *istioapi.ReadinessProbe) *istioapi.ReadinessProbe {
		p.InitialDelaySeconds, p.TimeoutSeconds, p.PeriodSeconds, p.SuccessThreshold, p.FailureThreshold = 3, 2, 5, 2, 4
		return p
	}
	tests := []struct {
		name  string
		probe *istioapi.ReadinessProbe
	}{
		{name: "no probe"},
		{name: "httpGet", probe: timing(&istioapi.ReadinessProbe{HealthCheckMethod: &istioapi.ReadinessProbe_HttpGet{HttpGet: &istioapi.HTTPHealthCheckConfig{
			Path: "/ready", Port: 8080, Host: "127.0.0.1", Scheme: "HTTP",
			HttpHeaders: []*istioapi.HTTPHeader{{Name: "x-probe", Value: "embark"}},
		}}})},
		{name: "tcpSocket", probe: timing(&istioapi.ReadinessProbe{HealthCheckMethod: &istioapi.ReadinessProbe_TcpSocket{TcpSocket: &istioapi.TCPHealthCheckConfig{Host: "127.0.0.1", Port: 9080}}})},
		{name: "exec", probe: timing(&istioapi.ReadinessProbe{HealthCheckMethod: &istioapi.ReadinessProbe_Exec{Exec: &istioapi.ExecHealthCheckConfig{Command: []string{"/usr/bin/test", "-f", "/run/ready"}}}})},
		{name: "grpc", probe: timing(&istioapi.ReadinessProbe{HealthCheckMethod: &istioapi.ReadinessProbe_Grpc{Grpc: &istioapi.GrpcHealthCheckConfig{Port: 9090, Service: "ratings.v1.Ratings"}}})},
		{name: "defaults only", probe: &istioapi.ReadinessProbe{HealthCheckMethod: &istioapi.ReadinessProbe_TcpSocket{TcpSocket: &istioapi.TCPHealthCheckConfig{Port: 9080}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			group := &istionetworkingv1.WorkloadGroup{ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: "bookinfo"}}
			group.Spec.Template = &istioapi.WorkloadEntry{ServiceAccount: "ratings-vm"}
			group.Spec.Probe = tt.probe
			snap, err := registry.Snapshot(group)
			if err != nil {
				t.Fatal(err)
			}
			war := &runtimev1alpha1.WorkloadAutoRegistration{
				ObjectMeta: metav1.ObjectMeta{Name: "ratings-vm-1", Namespace: "bookinfo"},
				Spec: runtimev1alpha1.WorkloadAutoRegistrationSpec{
					WorkloadGroup: snap,
					Registration: runtimev1alpha1.Registration{
						Host: runtimev1alpha1.HostInfo{Addresses: []runtimev1alpha1.HostAddress{{IP: "10.0.0.7", Type: runtimev1alpha1.AddressTypeVPC}}},
					},
				},
			}
			we, err := registry.BuildWorkloadEntry(war)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := we.Annotations[registry.AnnotationHealthChecksEnabled], map[bool]string{true: "true"}[tt.probe != nil]; got != want {
				t.Errorf("WorkloadEntry annotation %s = %q, want %q", registry.AnnotationHealthChecksEnabled, got, want)
			}
			s := &Server{opts: Options{Bootstrap: BootstrapSettings{DiscoveryAddress: "vmgateway.example:15012"}}}
			boot, err := s.bootstrap(&registry.Result{Registration: war, WorkloadEntry: we})
			if err != nil {
				t.Fatal(err)
			}
			// pilot-agent reads PROXY_CONFIG into a ProxyConfig.
			pc := &meshconfig.ProxyConfig{}
			if err := protojson.Unmarshal([]byte(boot.GetProxyConfigJson()), pc); err != nil {
				t.Fatalf("PROXY_CONFIG %s: %v", boot.GetProxyConfigJson(), err)
			}
			if !proto.Equal(pc.GetReadinessProbe(), tt.probe) {
				t.Errorf("readinessProbe = %v, want %v", pc.GetReadinessProbe(), tt.probe)
			}
			if pc.GetDiscoveryAddress() != "vmgateway.example:15012" {
				t.Errorf("discoveryAddress = %q", pc.GetDiscoveryAddress())
			}
		})
	}
}
