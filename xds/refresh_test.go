package xds

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/embark-mesh/embark/test/adsclient"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"k8s.io/apimachinery/pkg/types"
)

// gatedConfig is a settableConfig whose Snapshot of one workload, once
// armed, waits until the test releases it.
type gatedConfig struct {
	settableConfig
	mu      sync.Mutex
	gated   types.NamespacedName
	entered chan struct{}
	release chan struct{}
	// computed, when set, receives the key of every workload whose
	// configuration was computed without waiting.
	computed chan types.NamespacedName
}

func (c *gatedConfig) arm(key types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gated, c.entered, c.release = key, make(chan struct{}), make(chan struct{})
}

func (c *gatedConfig) Snapshot(ctx context.Context, p *Proxy) (cache.ResourceSnapshot, error) {
	c.mu.Lock()
	gated, entered, release, computed := p.Workload.Key == c.gated && c.release != nil, c.entered, c.release, c.computed
	c.mu.Unlock()
	if gated {
		close(entered)
		<-release
	}
	snap, err := c.settableConfig.Snapshot(ctx, p)
	if !gated && computed != nil {
		computed <- p.Workload.Key
	}
	return snap, err
}

// openUnacked opens w's stream on addr, asks for clusters and returns the
// first response, which must be of version want, not yet acknowledged.
func openUnacked(t *testing.T, addr string, w *workload, want string) (*adsclient.SotW, *discovery.DiscoveryResponse, context.CancelFunc) {
	t.Helper()
	s, err := adsclient.OpenSotW(t.Context(), dial(t, addr), w.token, sidecarNode(w.nodeID))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if err := s.Request(resource.ClusterType); err != nil {
		t.Fatal(err)
	}
	first := recvTimeout(t, s)
	if first.GetVersionInfo() != want {
		t.Fatalf("%s: first response version %q, want %s", w.key, first.GetVersionInfo(), want)
	}
	return s, first, s.Close
}

// openStream is openUnacked, the first response ACKed.
func openStream(t *testing.T, addr string, w *workload, want string) (*adsclient.SotW, context.CancelFunc) {
	t.Helper()
	s, first, cancel := openUnacked(t, addr, w, want)
	if err := s.ACK(first); err != nil {
		t.Fatal(err)
	}
	return s, cancel
}

// TestRefreshKeepsAReconnectedNodesNewerConfiguration: a node whose stream
// closes and reconnects while a refresh computes the others' configurations
// keeps what its new stream was given (computed from newer inputs, perhaps
// for another registration of the workload); the refresh does not set the
// configuration it computed for the closed stream over it.
func TestRefreshKeepsAReconnectedNodesNewerConfiguration(t *testing.T) {
	cfg := &gatedConfig{}
	cfg.set("v1", false, "a")
	srv, addr := startConfigServer(t, cfg, nil)
	ns := env.Namespace(t)
	fast := register(t, ns, "i-00000000000000f11", "10.0.9.11")
	slow := register(t, ns, "i-00000000000000f12", "10.0.9.12")
	_, closeFast := openStream(t, addr, fast, "v1")
	slowStream, _ := openStream(t, addr, slow, "v1")

	computed := make(chan types.NamespacedName, 16)
	cfg.mu.Lock()
	cfg.computed = computed
	cfg.mu.Unlock()
	cfg.set("v2", false, "b")
	cfg.arm(slow.key)
	done := make(chan struct{})
	go func() { defer close(done); srv.Refresh(t.Context(), fast.key, slow.key) }()
	for seen := false; !seen; {
		select {
		case k := <-computed:
			seen = k == fast.key
		case <-time.After(20 * time.Second):
			t.Fatal("the fast workload's configuration was never computed")
		}
	}
	select {
	case <-cfg.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the slow workload's configuration was never computed")
	}

	// While the slow one is computed, the fast node's stream closes and the
	// node reconnects with newer inputs.
	closeFast()
	deadline := time.Now().Add(20 * time.Second)
	for {
		srv.mu.Lock()
		attached := srv.nodes[fast.nodeID]
		srv.mu.Unlock()
		if attached == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fast node's closed stream was never detached")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cfg.set("v3", false, "c")
	again, _ := openStream(t, addr, fast, "v3")

	close(cfg.release)
	<-done
	if r := recvTimeout(t, slowStream); r.GetVersionInfo() != "v3" {
		t.Fatalf("slow workload: version %q, want v3", r.GetVersionInfo())
	}
	if r, err := again.Recv(time.Second); err == nil && r.GetVersionInfo() != "v3" {
		t.Fatalf("the reconnected fast node got version %q after v3: the refresh set what it computed for the closed stream", r.GetVersionInfo())
	}
}

// TestRefreshPublishesOnceAllAreComputed: a refresh of several workloads
// sets no proxy's configuration before every one is computed, so the
// streams send together instead of each waiting behind the computations
// left (benchmarks/push); then every proxy gets the change.
func TestRefreshPublishesOnceAllAreComputed(t *testing.T) {
	cfg := &gatedConfig{}
	cfg.set("v1", false, "a")
	srv, addr := startConfigServer(t, cfg, nil)
	ns := env.Namespace(t)
	fast := register(t, ns, "i-00000000000000f01", "10.0.9.1")
	slow := register(t, ns, "i-00000000000000f02", "10.0.9.2")
	streams := map[string]*adsclient.SotW{}
	for _, w := range []*workload{fast, slow} {
		streams[w.key.Name], _ = openStream(t, addr, w, "v1")
	}

	cfg.set("v2", false, "b")
	cfg.arm(slow.key)
	done := make(chan struct{})
	go func() { defer close(done); srv.Refresh(t.Context(), fast.key, slow.key) }()
	select {
	case <-cfg.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the slow workload's configuration was never computed")
	}
	// The fast workload's configuration is computed (or being computed by
	// the other worker); while the slow one's is not done, none is sent.
	if r, err := streams[fast.key.Name].Recv(500 * time.Millisecond); err == nil {
		t.Fatalf("the fast workload got version %q before the slow one's configuration was computed", r.GetVersionInfo())
	}
	close(cfg.release)
	r, err := streams[fast.key.Name].Recv(20 * time.Second)
	if err != nil {
		t.Fatalf("the fast workload never got v2: %v", err)
	}
	if r.GetVersionInfo() != "v2" {
		t.Fatalf("fast workload: version %q, want v2", r.GetVersionInfo())
	}
	if r := recvTimeout(t, streams[slow.key.Name]); r.GetVersionInfo() != "v2" {
		t.Fatalf("slow workload: version %q, want v2", r.GetVersionInfo())
	}
	<-done
}
