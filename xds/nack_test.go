package xds

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachetypes "github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"k8s.io/apimachinery/pkg/types"

	"github.com/embark-mesh/embark/registry/presence"
	"github.com/embark-mesh/embark/test/adsclient"
	"github.com/embark-mesh/embark/test/fixtures"
)

// settableConfig serves every proxy the clusters the test last set, under
// the version the test set; fail makes it fail.
type settableConfig struct {
	mu       sync.Mutex
	version  string
	clusters []string
	fail     bool
}

func (c *settableConfig) set(version string, fail bool, clusters ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.version, c.fail, c.clusters = version, fail, clusters
}

func (c *settableConfig) Snapshot(context.Context, *Proxy) (cache.ResourceSnapshot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail {
		return nil, errors.New("translation failed")
	}
	var rs []cachetypes.Resource
	for _, n := range c.clusters {
		rs = append(rs, &clusterv3.Cluster{Name: n})
	}
	return cache.NewSnapshot(c.version, map[resource.Type][]cachetypes.Resource{resource.ClusterType: rs, resource.ListenerType: {}})
}

// startConfigServer serves cfg on loopback without the debug listener.
func startConfigServer(t *testing.T, cfg ConfigSource, nacks *NACKMetrics) (*Server, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log := fixtures.Logger(t)
	conns, err := presence.NewConnections(ctx, presence.ConnectionOptions{Client: env.Client, Replica: "replica-a", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ctx, Options{
		Connections: conns, TokenReviews: clientset.AuthenticationV1().TokenReviews(),
		Reader: informers, APIReader: env.Client, Informers: informers,
		Config: cfg, NACKMetrics: nacks, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	srv.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() {
		g.Stop()
		<-done
		flush, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = conns.Flush(flush)
		cancel()
		conns.Wait()
	})
	return srv, lis.Addr().String()
}

// recvTimeout receives the next response or fails after 20s.
func recvTimeout(t *testing.T, s *adsclient.SotW) *discovery.DiscoveryResponse {
	t.Helper()
	resp, err := s.Recv(20 * time.Second)
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	return resp
}

func clusterNamesOf(t *testing.T, resp *discovery.DiscoveryResponse) []string {
	t.Helper()
	var out []string
	for _, a := range resp.GetResources() {
		c := &clusterv3.Cluster{}
		if err := a.UnmarshalTo(c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c.GetName())
	}
	return out
}

// TestANACKHoldsTheConfiguration: a rejected version is not sent again;
// the next response is the next configuration.
func TestANACKHoldsTheConfiguration(t *testing.T) {
	cfg := &settableConfig{}
	cfg.set("v1", false, "bad")
	reg := prometheus.NewRegistry()
	nacks, err := NewNACKMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	srv, addr := startConfigServer(t, cfg, nacks)
	w := register(t, env.Namespace(t), "i-0000000000000000a", "10.0.8.1")
	s, first, _ := openUnacked(t, addr, w, "v1")
	// NACK as Envoy does: the last accepted version (none) and an error.
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: first.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: "cluster bad: rejected"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		return testutil.ToFloat64(nacks.nacks.WithLabelValues("envoy.config.cluster.v3.Cluster")) == 1
	})
	// A refresh with the same configuration sends nothing; a changed one is
	// the next response.
	srv.Refresh(t.Context(), w.key)
	cfg.set("v2", false, "good")
	srv.Refresh(t.Context(), w.key)
	next := recvTimeout(t, s)
	if next.GetVersionInfo() != "v2" || len(clusterNamesOf(t, next)) != 1 || clusterNamesOf(t, next)[0] != "good" {
		t.Fatalf("after a NACK got version %q %v, want v2 [good] (the rejected version must not be resent)", next.GetVersionInfo(), clusterNamesOf(t, next))
	}
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: "v2", ResponseNonce: next.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	// syncz reports the type SYNCED again once the new version is ACKed.
	waitFor(t, func() bool {
		for _, st := range srv.streamsOf(w.key) {
			for _, c := range st.configs() {
				if c.GetTypeUrl() == resource.ClusterType {
					return c.GetConfigStatus().String() == "SYNCED" && c.GetVersionInfo() == "v2"
				}
			}
		}
		return false
	})
}

// TestAFailingFirstConfigurationServesAnEmptyOne: the stream is not refused.
func TestAFailingFirstConfigurationServesAnEmptyOne(t *testing.T) {
	cfg := &settableConfig{}
	cfg.set("v1", true)
	srv, addr := startConfigServer(t, cfg, nil)
	w := register(t, env.Namespace(t), "i-0000000000000000a", "10.0.8.2")
	c, err := open(t, dial(t, addr), false, w.token, sidecarNode(w.nodeID))
	if err != nil {
		t.Fatalf("a stream whose configuration fails was refused: %v", err)
	}
	defer c.cancel()
	if got := len(srv.Proxies()); got != 1 {
		t.Fatalf("Proxies() = %d proxies, want 1", got)
	}
	if got := srv.Proxies()[0].NodeID; got != w.nodeID {
		t.Errorf("Proxies()[0].NodeID = %q, want %q", got, w.nodeID)
	}
	if reg := srv.Proxies()[0].Registration; len(reg.ManagedFields) != 0 || len(reg.Status.Conditions) != 0 || reg.Status.Connection != nil {
		t.Errorf("the proxy keeps the registration's managed fields or status: %+v", reg)
	}
}

// streamsOf returns the workload's streams.
func (s *Server) streamsOf(key types.NamespacedName) []*stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*stream(nil), s.byWorkload[key]...)
}
