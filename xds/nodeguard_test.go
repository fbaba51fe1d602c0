package xds

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/embark-mesh/embark/test/fixtures"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// namedConfig serves each proxy one listener named after its registration,
// so a response shows whose configuration it is.
type namedConfig struct{}

func (namedConfig) Snapshot(_ context.Context, p *Proxy) (cache.ResourceSnapshot, error) {
	return cache.NewSnapshot("1", map[resource.Type][]types.Resource{
		resource.ListenerType: {&listenerv3.Listener{Name: "config-of-" + p.Workload.Key.Name}},
	})
}

// laterRequest is a request after the first on a SotW or Delta stream.
func (c *adsClient) send(typeURL string, node *core.Node, detail *rpcstatus.Status) error {
	if c.delta != nil {
		return c.delta.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: typeURL, Node: node, ErrorDetail: detail})
	}
	return c.sotw.Send(&discovery.DiscoveryRequest{TypeUrl: typeURL, Node: node, ErrorDetail: detail})
}

// drain reads until the stream ends and returns why, and the names of the
// listeners it was sent.
func (c *adsClient) drain() (listeners []string, err error) {
	for {
		if c.delta != nil {
			resp, err := c.delta.Recv(0)
			if err != nil {
				return listeners, err
			}
			for _, r := range resp.GetResources() {
				listeners = append(listeners, r.GetName())
			}
			continue
		}
		resp, err := c.sotw.Recv(0)
		if err != nil {
			return listeners, err
		}
		for _, a := range resp.GetResources() {
			l := &listenerv3.Listener{}
			if a.UnmarshalTo(l) == nil {
				listeners = append(listeners, l.GetName())
			}
		}
	}
}

// Every request after the first must carry no node or the first's node:
// anything else ends the stream PermissionDenied before go-control-plane
// adopts it, whatever the type, so a workload never gets another's
// configuration, reports another's health, or leaves state for an invented
// node.
func TestALaterRequestCannotSwitchNode(t *testing.T) {
	r := startReplica(t, "replica-a", nil, func(o *Options) { o.Config = namedConfig{} })
	ns := env.Namespace(t)
	a := register(t, ns, "i-0000000000000000a", "10.0.8.1")
	b := register(t, ns, "i-0000000000000000b", "10.0.8.2")
	conn := dial(t, r.addr)
	// B is connected, so B's configuration is in the snapshot cache.
	if _, err := open(t, conn, false, b.token, sidecarNode(b.nodeID)); err != nil {
		t.Fatal(err)
	}
	otherCluster := sidecarNode(a.nodeID)
	otherCluster.Cluster = "another-cluster"
	otherMeta := proto.Clone(sidecarNode(a.nodeID)).(*core.Node)
	otherMeta.Metadata.Fields["PROXY_CONFIG"] = nil
	delete(otherMeta.Metadata.Fields, "PROXY_CONFIG")
	invented := func(i int) *core.Node {
		return sidecarNode(fixtures.NodeID("10.0.8.1", client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("invented-%d", i)}))
	}
	tests := []struct {
		name    string
		typeURL string
		node    *core.Node
		detail  *rpcstatus.Status
	}{
		{name: "listeners as B", typeURL: resource.ListenerType, node: sidecarNode(b.nodeID)},
		{name: "clusters as B", typeURL: resource.ClusterType, node: sidecarNode(b.nodeID)},
		{name: "health of B", typeURL: TypeHealthInformation, node: sidecarNode(b.nodeID), detail: &rpcstatus.Status{Message: "B is down"}},
		{name: "invented node ID", typeURL: resource.ListenerType, node: invented(0)},
		{name: "same ID, another cluster", typeURL: resource.ListenerType, node: otherCluster},
		{name: "same ID, other metadata", typeURL: resource.ListenerType, node: otherMeta},
	}
	want := 0.0
	for _, tt := range tests {
		for _, delta := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/delta=%v", tt.name, delta), func(t *testing.T) {
				c, err := open(t, conn, delta, a.token, sidecarNode(a.nodeID))
				if err != nil {
					t.Fatal(err)
				}
				if err := c.send(tt.typeURL, tt.node, tt.detail); err != nil {
					t.Fatal(err)
				}
				got, err := c.drain()
				if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "a stream serves one node") {
					t.Errorf("stream ended with %v, want PermissionDenied: a stream serves one node", err)
				}
				if slices.Contains(got, "config-of-"+b.key.Name) {
					t.Errorf("A was sent B's configuration: %v", got)
				}
			})
			want++
		}
	}
	if got := testutil.ToFloat64(r.metrics.closed.WithLabelValues(closeNodeSwitched)); got != want {
		t.Errorf("embark_xds_streams_closed_by_server_total{reason=%q} = %v, want %v", closeNodeSwitched, got, want)
	}
	if got := r.health.all(); len(got) != 0 {
		t.Errorf("health reports accepted from switched nodes: %+v", got)
	}

	// Many invented node IDs leave nothing: once A's streams are gone, the
	// snapshot cache knows B's node only, and A has no stream.
	for i := 1; i <= 20; i++ {
		c, err := open(t, conn, i%2 == 0, a.token, sidecarNode(a.nodeID))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.send(resource.ListenerType, invented(i), nil); err != nil {
			t.Fatal(err)
		}
		if _, err := c.drain(); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("invented node %d: %v", i, err)
		}
	}
	waitFor(t, func() bool { return r.conns.Streams(a.key) == 0 })
	if keys := r.server.snapshots.GetStatusKeys(); !slices.Equal(keys, []string{b.nodeID}) {
		t.Errorf("snapshot cache status entries %v, want only B's %s", keys, b.nodeID)
	}
	r.server.mu.Lock()
	nodes, workloads := len(r.server.nodes), len(r.server.byWorkload)
	r.server.mu.Unlock()
	if nodes != 1 || workloads != 1 {
		t.Errorf("server tracks %d nodes and %d workloads, want B's only", nodes, workloads)
	}
}

// The same node again, or none, keeps the stream: Envoy resends its node
// on every request unless told not to.
func TestALaterRequestWithTheSameNodeIsServed(t *testing.T) {
	r := startReplica(t, "replica-a", nil, func(o *Options) { o.Config = namedConfig{} })
	a := register(t, env.Namespace(t), "i-0000000000000000a", "10.0.8.3")
	conn := dial(t, r.addr)
	for _, delta := range []bool{false, true} {
		c, err := open(t, conn, delta, a.token, sidecarNode(a.nodeID))
		if err != nil {
			t.Fatal(err)
		}
		for _, node := range []*core.Node{sidecarNode(a.nodeID), nil} {
			if err := c.send(TypeHealthInformation, node, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Each report passed the check (a refused request reaches nothing), and
	// no stream was closed.
	waitFor(t, func() bool { return len(r.health.all()) == 4 })
	if got := testutil.ToFloat64(r.metrics.closed.WithLabelValues(closeNodeSwitched)); got != 0 {
		t.Errorf("%v streams closed for a node switch, want 0", got)
	}
}

// syncz streams are pinned to their first node too.
func TestASynczStreamCannotSwitchNode(t *testing.T) {
	r := startReplica(t, "replica-a", nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	s, err := discovery.NewAggregatedDiscoveryServiceClient(dial(t, r.debugAddr)).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "debug~0.0.0.0~istioctl~.svc.cluster.local"}, TypeUrl: TypeSyncz}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "debug~0.0.0.0~other~.svc.cluster.local"}, TypeUrl: TypeSyncz}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err = s.Recv(); err != nil {
			break
		}
	}
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("syncz stream with another node: %v, want PermissionDenied", err)
	}
}
