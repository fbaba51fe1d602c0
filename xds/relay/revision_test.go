package relay_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/xds/relay"
)

// revisions is a Hooks.Revision the test moves: the revision it names and
// the channel closed when it changes.
type revisions struct {
	mu      sync.Mutex
	rev     string
	changed chan struct{}
}

func (r *revisions) get() (string, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rev, r.changed
}

func (r *revisions) set(rev string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rev = rev
	close(r.changed)
	r.changed = make(chan struct{})
}

// revFrontend serves a relay whose streams follow revs.
type revFrontend struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	relay *relay.Relay
	revs  *revisions
}

func (f *revFrontend) StreamAggregatedResources(ss discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	return f.relay.SotW(ss.Context(), ss, "Bearer sidecar-token", relay.Hooks[discovery.DiscoveryRequest, discovery.DiscoveryResponse]{Revision: f.revs.get})
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestStreamMovesBetweenRevisions relays one sidecar stream to the default
// istiod, moves it to the canary revision's istiod and back when its
// revision changes: the sidecar's stream stays open throughout, each move
// closes the stream to the istiod left, and the istiod moved to gets the
// node and the subscription with the version the sidecar accepted last, and
// answers on the same sidecar stream; an unknown revision stays on the
// default istiod.
func TestStreamMovesBetweenRevisions(t *testing.T) {
	def, canary := startUpstream(t), startUpstream(t)
	def.publish(t, "d1", time.Second)
	canary.publish(t, "c1", 2*time.Second)
	revs := &revisions{changed: make(chan struct{})}
	r, err := relay.New(relay.Options{Conn: dial(t, def.addr), Revisions: map[string]grpc.ClientConnInterface{"canary": dial(t, canary.addr)},
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(g, &revFrontend{relay: r, revs: revs})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)

	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer sidecar-token"))
	defer cancel()
	s, err := discovery.NewAggregatedDiscoveryServiceClient(dial(t, lis.Addr().String())).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DiscoveryRequest{Node: sidecarNode(), TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	ack := func(resp *discovery.DiscoveryResponse) {
		t.Helper()
		if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
			t.Fatal(err)
		}
	}
	first := recvSotW(t, s)
	if got := connectTimeout(t, first); got != time.Second || first.GetVersionInfo() != "d1" {
		t.Fatalf("first response: version %q timeout %v, want the default istiod's d1 1s", first.GetVersionInfo(), got)
	}
	ack(first)

	steps := []struct {
		name        string
		rev         string
		to, from    *upstream
		wantVersion string
		wantTimeout time.Duration
		wantAsked   string // the version the istiod moved to is told the sidecar has
	}{
		{name: "to canary", rev: "canary", to: canary, from: def, wantVersion: "c1", wantTimeout: 2 * time.Second, wantAsked: "d1"},
		{name: "rolled back", rev: "", to: def, from: canary, wantVersion: "d1", wantTimeout: time.Second, wantAsked: "c1"},
	}
	for i, step := range steps {
		openedBefore, _, nodesBefore, reqsBefore, _ := step.to.snapshot()
		revs.set(step.rev)
		resp := recvSotW(t, s)
		if got := connectTimeout(t, resp); got != step.wantTimeout || resp.GetVersionInfo() != step.wantVersion {
			t.Fatalf("%s: response version %q timeout %v, want %s %v", step.name, resp.GetVersionInfo(), got, step.wantVersion, step.wantTimeout)
		}
		if gen := i + 2; !strings.HasPrefix(resp.GetNonce(), strconv.Itoa(gen)+":") {
			t.Errorf("%s: nonce %q does not carry upstream generation %d", step.name, resp.GetNonce(), gen)
		}
		ack(resp)
		fixtures.Eventually(t, 10*time.Second, step.name+": the ACK relayed", func() bool {
			_, _, _, reqs, _ := step.to.snapshot()
			return len(reqs) >= len(reqsBefore)+2
		})
		opened, _, nodes, reqs, _ := step.to.snapshot()
		if opened != openedBefore+1 || len(nodes) != len(nodesBefore)+1 || nodes[len(nodes)-1].GetId() != nodeID {
			t.Errorf("%s: the istiod moved to opened %d streams with nodes %v, want one with node %s", step.name, opened-openedBefore, nodes[len(nodesBefore):], nodeID)
		}
		if resync := reqs[len(reqsBefore)]; resync.GetVersionInfo() != step.wantAsked || resync.GetTypeUrl() != resource.ClusterType {
			t.Errorf("%s: resynchronisation %q version %q, want clusters at %q", step.name, resync.GetTypeUrl(), resync.GetVersionInfo(), step.wantAsked)
		}
		fixtures.Eventually(t, 10*time.Second, step.name+": the stream to the istiod left closed", func() bool {
			return step.from.openStreams() == 0 && step.to.openStreams() == 1
		})
	}

	// A revision without an istiod is served by the default one: no move.
	openedBefore, _, _, _, _ := def.snapshot()
	revs.set("unknown")
	time.Sleep(200 * time.Millisecond) // nothing to wait for: the stream must not move
	if opened, _, _, _, _ := def.snapshot(); opened != openedBefore || def.openStreams() != 1 {
		t.Errorf("an unknown revision moved the stream: %d new streams to the default istiod, %d open", opened-openedBefore, def.openStreams())
	}
}
