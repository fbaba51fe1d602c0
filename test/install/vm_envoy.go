//go:build install

package install

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	demovm "github.com/embark-mesh/embark/test/demo/vm"
	"github.com/embark-mesh/embark/test/istioagent"
)

// StartEnvoyStandIn plays Envoy's part for the VM's sidecar until the test
// ends: there is no Envoy binary here (the istio-sidecar package runs
// pilot-agent with DISABLE_ENVOY=true), so, as test/demo/vm does, the test
// opens the stream Envoy would open on pilot-agent's XDS socket
// (/etc/istio/proxy/XDS, pilot-agent's working directory being /) with the
// node of the gRPC bootstrap pilot-agent wrote beside it, and subscribes
// and ACKs as Envoy does (demovm.PlayEnvoy). When the stream ends (the
// sidecar restarted) it connects again, as a restarted Envoy would.
func (v *VM) StartEnvoyStandIn(t *testing.T) {
	t.Helper()
	// A short path to the VM's /var/lib/istio/proxy (/etc/istio links
	// there): a unix socket's path is limited to 108 bytes.
	link := filepath.Join(t.TempDir(), "proxy")
	if len(link) > 80 {
		dir, err := os.MkdirTemp("", "vmx")
		must(t, err)
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		link = filepath.Join(dir, "proxy")
	}
	must(t, os.Symlink(v.Path("/var/lib/istio/proxy"), link))
	ctx, stop := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan struct{})
	var last error // the stream's last end, shown when the test fails
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			node, err := istioagent.NodeFromGRPCBootstrap(filepath.Join(link, "grpc-bootstrap.json"))
			if err == nil {
				var c *istioagent.Client
				if c, err = istioagent.ConnectSocket(ctx, t, filepath.Join(link, "XDS"), node); err == nil {
					err = demovm.PlayEnvoy(ctx, c)
					_ = c.Close()
				}
			}
			last = err
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		stop()
		<-done
		if t.Failed() {
			t.Logf("the Envoy stand-in's last stream ended with: %v", last)
		}
	})
}
