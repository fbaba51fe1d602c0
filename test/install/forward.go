package install

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// portForward is one Service port and the container port it reaches.
type portForward struct {
	Name       string
	Port       int32
	TargetPort int32
}

// servicePorts resolves each port of svc to a port of container as
// kube-proxy does: a numeric targetPort as it is, a named one by the
// container's port of that name, none by the port itself.
func servicePorts(svc *corev1.Service, container *corev1.Container) ([]portForward, error) {
	var out []portForward
	for _, p := range svc.Spec.Ports {
		if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
			return nil, fmt.Errorf("service %s port %s: protocol %s: only TCP is forwarded", svc.Name, p.Name, p.Protocol)
		}
		target, err := targetPort(p, container)
		if err != nil {
			return nil, fmt.Errorf("service %s port %s: %w", svc.Name, p.Name, err)
		}
		out = append(out, portForward{Name: p.Name, Port: p.Port, TargetPort: target})
	}
	return out, nil
}

func targetPort(p corev1.ServicePort, c *corev1.Container) (int32, error) {
	switch {
	case p.TargetPort.Type == intstr.String && p.TargetPort.StrVal != "":
		for _, cp := range c.Ports {
			if cp.Name == p.TargetPort.StrVal {
				return cp.ContainerPort, nil
			}
		}
		return 0, fmt.Errorf("targetPort %q names no port of container %s", p.TargetPort.StrVal, c.Name)
	case p.TargetPort.Type == intstr.Int && p.TargetPort.IntVal != 0:
		return p.TargetPort.IntVal, nil
	default:
		return p.Port, nil
	}
}

// forward accepts connections on ln until the test ends and copies each,
// both ways, to a new connection to target.
func forward(t *testing.T, ln net.Listener, target string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		_ = ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					t.Logf("forwarder %s: accept: %v", ln.Addr(), err)
				}
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				pipe(ctx, c, target)
			}()
		}
	}()
}

// pipe copies between c and a new connection to target until either side
// closes or ctx ends.
func pipe(ctx context.Context, c net.Conn, target string) {
	defer c.Close()
	var d net.Dialer
	up, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		return
	}
	defer up.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.Close(); _ = up.Close() })
	defer stop()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); closeWrite(up); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); closeWrite(c); done <- struct{}{} }()
	<-done
	<-done
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}
