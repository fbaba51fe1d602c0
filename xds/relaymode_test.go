package xds

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/xds/relay"
)

// standIn is an xDS server standing in for istiod (go-control-plane) where
// the test needs to see what the relay sends upstream; the tests in
// istiod_test.go run the relay against the real istiod.
type standIn struct {
	addr  string
	cache cache.SnapshotCache
	g     *grpc.Server

	mu     sync.Mutex
	open   int
	tokens []string
	types  []string
}

func startStandIn(t *testing.T, nodeID string) *standIn {
	t.Helper()
	s := &standIn{cache: cache.NewSnapshotCache(false, cache.IDHash{}, nil)}
	snap, err := cache.NewSnapshot("v1", map[resource.Type][]types.Resource{resource.ListenerType: {}, resource.ClusterType: {}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(t.Context(), nodeID, snap); err != nil {
		t.Fatal(err)
	}
	srv := serverv3.NewServer(context.Background(), s.cache, serverv3.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, _ int64, _ string) error {
			md, _ := metadata.FromIncomingContext(ctx)
			s.mu.Lock()
			defer s.mu.Unlock()
			s.open++
			s.tokens = append(s.tokens, strings.Join(md.Get("authorization"), ","))
			return nil
		},
		StreamClosedFunc: func(int64, *core.Node) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.open--
		},
		StreamRequestFunc: func(_ int64, r *discovery.DiscoveryRequest) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.types = append(s.types, r.GetTypeUrl())
			return nil
		},
	})
	s.g = grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(s.g, srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = lis.Addr().String()
	go func() { _ = s.g.Serve(lis) }()
	t.Cleanup(s.g.Stop)
	return s
}

func (s *standIn) relay(t *testing.T) *relay.Relay {
	t.Helper()
	conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	r, err := relay.New(relay.Options{Conn: conn, MaxBackoff: 200 * time.Millisecond, Logger: fixtures.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (s *standIn) state() (open int, tokens, typeURLs []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open, slices.Clone(s.tokens), slices.Clone(s.types)
}

// TestRelayModeKeepsLivenessAndHealth: in istiod mode the server still
// authenticates, keeps the stream as the workload's liveness and its health
// reports (never relayed), refuses debug types, relays with the sidecar's
// own token and keeps the stream while the upstream is gone.
func TestRelayModeKeepsLivenessAndHealth(t *testing.T) {
	ns := env.Namespace(t)
	w := register(t, ns, "i-00000000000000e1a", "10.0.8.1")
	up := startStandIn(t, w.nodeID)
	r := startReplica(t, "replica-a", nil, func(o *Options) { o.Relay = up.relay(t) })
	conn := dial(t, r.addr)

	if _, err := open(t, conn, false, "", sidecarNode(w.nodeID)); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v, want Unauthenticated", err)
	}
	c, err := open(t, conn, false, w.token, sidecarNode(w.nodeID))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, w.key, connected("replica-a"))
	before := agentConnected(t, w)
	if _, tokens, _ := up.state(); !slices.Equal(tokens, []string{"Bearer " + w.token}) {
		t.Errorf("upstream authorization %q, want the sidecar's token", tokens)
	}

	health := func() {
		t.Helper()
		n := len(r.health.all())
		if err := c.sotw.Send(&discovery.DiscoveryRequest{TypeUrl: TypeHealthInformation}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return len(r.health.all()) == n+1 })
	}
	health()
	// The upstream goes away: the sidecar's stream stays and is served.
	up.g.Stop()
	health()
	if after := agentConnected(t, w); !after.LastTransitionTime.Equal(&before.LastTransitionTime) || r.conns.Streams(w.key) != 1 {
		t.Errorf("the workload's connection changed while its upstream was gone: %+v -> %+v", before, after)
	}
	if _, _, typeURLs := up.state(); slices.Contains(typeURLs, TypeHealthInformation) {
		t.Error("a health report was relayed upstream")
	}
	// Debug types stay refused on sidecar streams.
	if err := c.sotw.Send(&discovery.DiscoveryRequest{TypeUrl: TypeSyncz}); err != nil {
		t.Fatal(err)
	}
	if err := c.recvErr(); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("syncz on a sidecar stream: %v, want PermissionDenied", err)
	}
	waitState(t, w.key, disconnected("replica-a"))
}

// TestRelayModeServerClosesStreams: in istiod mode the relay reads the
// sidecar itself, so the server's closes must still reach it: a
// request with another node ends the stream PermissionDenied before it is
// relayed, and a deleted registration ends it Unavailable; either way the
// workload's stream count drops to zero and the upstream stream closes.
func TestRelayModeServerClosesStreams(t *testing.T) {
	for _, tt := range []struct {
		name     string
		instance string
		ip       string
		close    func(t *testing.T, c *adsClient, w *workload)
		wantCode codes.Code
	}{
		{"node switched", "i-00000000000000e2a", "10.0.8.2", func(t *testing.T, c *adsClient, w *workload) {
			other := sidecarNode(w.nodeID)
			other.Cluster = "elsewhere"
			if err := c.sotw.Send(&discovery.DiscoveryRequest{Node: other, TypeUrl: resource.ClusterType}); err != nil {
				t.Fatal(err)
			}
		}, codes.PermissionDenied},
		{"registration deleted", "i-00000000000000e2b", "10.0.8.3", func(t *testing.T, _ *adsClient, w *workload) {
			if err := env.Client.Delete(t.Context(), w.res.Registration); err != nil {
				t.Fatal(err)
			}
		}, codes.Unavailable},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := register(t, env.Namespace(t), tt.instance, tt.ip)
			up := startStandIn(t, w.nodeID)
			r := startReplica(t, "replica-a", nil, func(o *Options) { o.Relay = up.relay(t) })
			c, err := open(t, dial(t, r.addr), false, w.token, sidecarNode(w.nodeID))
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, func() bool { open, _, _ := up.state(); return open == 1 })
			tt.close(t, c, w)
			errc := make(chan error, 1)
			go func() { errc <- c.recvErr() }()
			select {
			case err := <-errc:
				if status.Code(err) != tt.wantCode {
					t.Errorf("stream ended with %v, want %v", err, tt.wantCode)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the relayed stream stays open")
			}
			waitFor(t, func() bool { return r.conns.Streams(w.key) == 0 })
			waitFor(t, func() bool { open, _, _ := up.state(); return open == 0 })
			if _, _, typeURLs := up.state(); tt.wantCode == codes.PermissionDenied && slices.Contains(typeURLs, resource.ClusterType) {
				t.Error("the request with another node was relayed")
			}
		})
	}
}
