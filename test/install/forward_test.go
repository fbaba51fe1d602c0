package install

import (
	"io"
	"net"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// A Service's ports reach the container as kube-proxy resolves them: a
// named targetPort by the container's port of that name, a number as it is,
// none by the port itself; a name the container lacks, or UDP, is an error.
func TestServicePorts(t *testing.T) {
	c := &corev1.Container{Name: "ep", Ports: []corev1.ContainerPort{{Name: "grpc-onboard", ContainerPort: 15443}, {Name: "https-repository", ContainerPort: 8443}}}
	svc := func(ports ...corev1.ServicePort) *corev1.Service {
		s := &corev1.Service{Spec: corev1.ServiceSpec{Ports: ports}}
		s.Name = "vmgateway"
		return s
	}
	tests := []struct {
		name    string
		svc     *corev1.Service
		want    []portForward
		wantErr string
	}{
		{name: "named, numbered, none", svc: svc(
			corev1.ServicePort{Name: "grpc-onboard", Port: 15443, TargetPort: intstr.FromString("grpc-onboard")},
			corev1.ServicePort{Name: "https", Port: 443, TargetPort: intstr.FromString("https-repository")},
			corev1.ServicePort{Name: "n", Port: 80, TargetPort: intstr.FromInt32(8080)},
			corev1.ServicePort{Name: "same", Port: 9000}),
			want: []portForward{{"grpc-onboard", 15443, 15443}, {"https", 443, 8443}, {"n", 80, 8080}, {"same", 9000, 9000}}},
		{name: "name the container lacks", svc: svc(corev1.ServicePort{Name: "x", Port: 1, TargetPort: intstr.FromString("grpc-xds")}),
			wantErr: `service vmgateway port x: targetPort "grpc-xds" names no port of container ep`},
		{name: "UDP", svc: svc(corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}),
			wantErr: "protocol UDP: only TCP is forwarded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := servicePorts(tc.svc, c)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ports %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The forwarder copies both ways and passes the client's half-close on.
func TestForward(t *testing.T) {
	upstream, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer upstream.Close()
	go func() {
		c, err := upstream.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		data, _ := io.ReadAll(c)
		_, _ = c.Write([]byte("echo:" + string(data)))
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	forward(t, ln, upstream.Addr().String())
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "echo:hello" {
		t.Errorf("through the forwarder: %q %v, want echo:hello", got, err)
	}
}
