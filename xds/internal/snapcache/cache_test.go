package snapcache

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	streamv3 "github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func listener(name string, port uint32) *listenerv3.Listener {
	return &listenerv3.Listener{Name: name, Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
		Address: "127.0.0.2", PortSpecifier: &core.SocketAddress_PortValue{PortValue: port},
	}}}}
}

func clusterOf(name string) *clusterv3.Cluster {
	return &clusterv3.Cluster{Name: name, PerConnectionBufferLimitBytes: wrapperspb.UInt32(1024)}
}

// snapshotOf is a Snapshot of listeners (a shared set and an own one) and
// clusters, each type versioned v.
func snapshotOf(t *testing.T, v string, shared, own *Set, clusters *Set) *Snapshot {
	t.Helper()
	s := NewSnapshot()
	if err := s.SetType(resource.ListenerType, v, shared, own); err != nil {
		t.Fatal(err)
	}
	if err := s.SetType(resource.ClusterType, v, clusters); err != nil {
		t.Fatal(err)
	}
	return s
}

// plainOf is the same configuration as snapshotOf as a go-control-plane
// snapshot.
func plainOf(t *testing.T, v string, sets ...*Set) *cache.Snapshot {
	t.Helper()
	byType := map[resource.Type][]types.Resource{}
	for _, s := range sets {
		byType[s.typeURL] = append(byType[s.typeURL], s.resources...)
	}
	snap, err := cache.NewSnapshot(v, byType)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// watcher is what both caches offer for state-of-the-world streams.
type watcher interface {
	SetSnapshot(ctx context.Context, node string, snap cache.ResourceSnapshot) error
	CreateWatch(req *cache.Request, sub cache.Subscription, out chan cache.Response) (func(), error)
	ClearSnapshot(node string)
}

// client is one stream's state of one type, as go-control-plane's server
// keeps it.
type client struct {
	node    string
	typeURL string
	names   []string
	sub     streamv3.Subscription
	version string
	out     chan cache.Response
	cancel  func()
}

func newClient(node, typeURL string, names ...string) *client {
	return &client{node: node, typeURL: typeURL, names: names, sub: streamv3.NewSotwSubscription(names, true), out: make(chan cache.Response, 1)}
}

// request opens the client's next watch (after a response it ACKed).
func (c *client) request(t *testing.T, w watcher) {
	t.Helper()
	req := &discovery.DiscoveryRequest{Node: &core.Node{Id: c.node}, TypeUrl: c.typeURL, ResourceNames: c.names, VersionInfo: c.version}
	cancel, err := w.CreateWatch(req, &c.sub, c.out)
	if err != nil {
		t.Fatal(err)
	}
	c.cancel = cancel
}

// received is what a response carried, comparable across the caches (whose
// resource orders differ): the version, the resources' names and
// encodings by name, and the returned resources.
type received struct {
	version  string
	names    []string
	encoding map[string][]byte
	returned map[string]string
}

// take returns the response the client has, if any, ACKing it.
func (c *client) take(t *testing.T) (*received, cache.Response) {
	t.Helper()
	select {
	case r := <-c.out:
		d, err := r.GetDiscoveryResponse()
		if err != nil {
			t.Fatal(err)
		}
		got := &received{version: d.GetVersionInfo(), encoding: map[string][]byte{}, returned: r.GetReturnedResources()}
		for _, a := range d.GetResources() {
			if a.GetTypeUrl() != c.typeURL {
				t.Fatalf("resource of type %s in a %s response", a.GetTypeUrl(), c.typeURL)
			}
			m, err := a.UnmarshalNew()
			if err != nil {
				t.Fatal(err)
			}
			name := cache.GetResourceName(m)
			got.names = append(got.names, name)
			got.encoding[name] = a.GetValue()
		}
		slices.Sort(got.names)
		c.sub.SetReturnedResources(r.GetReturnedResources())
		c.version = d.GetVersionInfo()
		return got, r
	default:
		return nil, nil
	}
}

func TestWatchesAnswerAsGoControlPlane(t *testing.T) {
	sharedA := NewSet(resource.ListenerType, []types.Resource{listener("out_80", 80), listener("out_443", 443)})
	sharedB := NewSet(resource.ListenerType, []types.Resource{listener("out_80", 8080)})
	own := NewSet(resource.ListenerType, []types.Resource{listener("in_9080", 9080)})
	clustersA := NewSet(resource.ClusterType, []types.Resource{clusterOf("a"), clusterOf("b")})
	clustersB := NewSet(resource.ClusterType, []types.Resource{clusterOf("a"), clusterOf("c")})

	// steps: 's' sets version v, 'r' makes the client request again (its
	// last version), 'x' cancels its watch, 'c' clears the node.
	type step struct {
		op       byte
		version  string
		shared   *Set
		clusters *Set
	}
	set := func(v string, shared, clusters *Set) step {
		return step{op: 's', version: v, shared: shared, clusters: clusters}
	}
	tests := []struct {
		name    string
		typeURL string
		names   []string
		steps   []step
		// silent: no step is answered (else at least one must be).
		silent bool
	}{
		{name: "wildcard listeners: first snapshot, same version, a new one", typeURL: resource.ListenerType,
			steps: []step{{op: 'r'}, set("1", sharedA, clustersA), {op: 'r'}, set("1", sharedA, clustersA), set("2", sharedB, clustersA), {op: 'r'}}},
		{name: "snapshot before the request", typeURL: resource.ListenerType,
			steps: []step{set("1", sharedA, clustersA), {op: 'r'}, {op: 'r'}, set("2", sharedA, clustersB)}},
		{name: "named clusters: only those, and a name added later", typeURL: resource.ClusterType, names: []string{"a"},
			steps: []step{set("1", sharedA, clustersA), {op: 'r'}, {op: 'r'}, set("2", sharedA, clustersB), {op: 'r'}}},
		{name: "a name not in the snapshot", typeURL: resource.ClusterType, names: []string{"c"},
			steps: []step{set("1", sharedA, clustersA), {op: 'r'}, {op: 'r'}, set("2", sharedA, clustersB), {op: 'r'}}},
		{name: "cancelled watch is not answered", typeURL: resource.ListenerType,
			steps: []step{set("1", sharedA, clustersA), {op: 'r'}, {op: 'r'}, {op: 'x'}, set("2", sharedB, clustersA)}},
		{name: "cleared node forgets its watches", typeURL: resource.ListenerType,
			steps: []step{set("1", sharedA, clustersA), {op: 'r'}, {op: 'r'}, {op: 'c'}, set("2", sharedB, clustersA), {op: 'r'}}},
		{name: "a type the snapshot lacks", typeURL: resource.RouteType,
			steps: []step{set("1", sharedA, clustersA), {op: 'r'}, set("2", sharedB, clustersB)}, silent: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ours := New(cache.NewSnapshotCache(false, cache.IDHash{}, nil), slog.New(slog.DiscardHandler))
			theirs := cache.NewSnapshotCache(false, cache.IDHash{}, nil)
			a, b := newClient("n", tt.typeURL, tt.names...), newClient("n", tt.typeURL, tt.names...)
			answered := 0
			for i, st := range tt.steps {
				switch st.op {
				case 's':
					if err := ours.SetSnapshot(t.Context(), "n", snapshotOf(t, st.version, st.shared, own, st.clusters)); err != nil {
						t.Fatal(err)
					}
					if err := theirs.SetSnapshot(t.Context(), "n", plainOf(t, st.version, st.shared, own, st.clusters)); err != nil {
						t.Fatal(err)
					}
				case 'r':
					a.request(t, ours)
					b.request(t, theirs)
				case 'x':
					a.cancel()
					b.cancel()
				case 'c':
					ours.ClearSnapshot("n")
					theirs.ClearSnapshot("n")
				}
				got, _ := a.take(t)
				want, _ := b.take(t)
				if (got == nil) != (want == nil) {
					t.Fatalf("step %d (%c): answered %v, go-control-plane %v", i, st.op, got != nil, want != nil)
				}
				if got == nil {
					continue
				}
				answered++
				if got.version != want.version || !slices.Equal(got.names, want.names) {
					t.Fatalf("step %d: version %q names %v, go-control-plane %q %v", i, got.version, got.names, want.version, want.names)
				}
				for name, enc := range want.encoding {
					if !bytes.Equal(got.encoding[name], enc) {
						t.Errorf("step %d: %s encoded differently from go-control-plane", i, name)
					}
				}
				if len(got.returned) != len(want.returned) {
					t.Fatalf("step %d: returned %v, go-control-plane %v", i, got.returned, want.returned)
				}
				for k, v := range want.returned {
					if got.returned[k] != v {
						t.Fatalf("step %d: returned %v, go-control-plane %v", i, got.returned, want.returned)
					}
				}
			}
			if tt.silent != (answered == 0) {
				t.Fatalf("%d steps answered, want none: %v", answered, tt.silent)
			}
		})
	}
}

// TestSetEncodedOnce: nodes holding the same set are sent the same encoded
// resources (one encoding), their own sets their own.
func TestSetEncodedOnce(t *testing.T) {
	c := New(cache.NewSnapshotCache(false, cache.IDHash{}, nil), slog.New(slog.DiscardHandler))
	shared := NewSet(resource.ListenerType, []types.Resource{listener("out_80", 80)})
	clusters := NewSet(resource.ClusterType, nil)
	var anys [2]map[string]*anypb.Any
	for i, node := range []string{"a", "b"} {
		own := NewSet(resource.ListenerType, []types.Resource{listener("in_"+node, 9080)})
		if err := c.SetSnapshot(t.Context(), node, snapshotOf(t, "1", shared, own, clusters)); err != nil {
			t.Fatal(err)
		}
		cl := newClient(node, resource.ListenerType)
		cl.request(t, c)
		select {
		case r := <-cl.out:
			d, err := r.GetDiscoveryResponse()
			if err != nil {
				t.Fatal(err)
			}
			anys[i] = map[string]*anypb.Any{}
			for _, a := range d.GetResources() {
				m, err := a.UnmarshalNew()
				if err != nil {
					t.Fatal(err)
				}
				anys[i][cache.GetResourceName(m)] = a
			}
		default:
			t.Fatalf("node %s was not answered", node)
		}
	}
	if anys[0]["out_80"] == nil || anys[0]["out_80"] != anys[1]["out_80"] {
		t.Error("the shared listener was encoded for each node")
	}
	if len(anys[0]) != 2 || len(anys[1]) != 2 || anys[0]["in_a"] == nil || anys[1]["in_b"] == nil {
		t.Errorf("responses hold %v and %v, want the shared and each node's own listener", anys[0], anys[1])
	}
	want, err := cache.MarshalResource(listener("out_80", 80))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(anys[0]["out_80"].GetValue(), want) {
		t.Error("the shared listener's encoding is not its deterministic encoding")
	}
}

// TestSnapshotViews: the ResourceSnapshot views (delta streams, readers)
// hold every set's resources, and the version map hashes their encodings.
func TestSnapshotViews(t *testing.T) {
	shared := NewSet(resource.ListenerType, []types.Resource{listener("out_80", 80)})
	own := NewSet(resource.ListenerType, []types.Resource{listener("in_9080", 9080)})
	clusters := NewSet(resource.ClusterType, []types.Resource{clusterOf("a")})
	s := snapshotOf(t, "v1", shared, own, clusters)
	plain := plainOf(t, "v1", shared, own, clusters)
	if err := s.ConstructVersionMap(); err != nil {
		t.Fatal(err)
	}
	if err := plain.ConstructVersionMap(); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{resource.ListenerType, resource.ClusterType, resource.RouteType} {
		if s.GetVersion(typ) != plain.GetVersion(typ) {
			t.Errorf("%s: version %q, want %q", typ, s.GetVersion(typ), plain.GetVersion(typ))
		}
		got, want := s.GetResources(typ), plain.GetResources(typ)
		if len(got) != len(want) {
			t.Errorf("%s: %d resources, want %d", typ, len(got), len(want))
		}
		for name, r := range want {
			if !proto.Equal(got[name], r) || s.GetResourcesAndTTL(typ)[name].Resource != got[name] {
				t.Errorf("%s %s differs", typ, name)
			}
		}
		gv, wv := s.GetVersionMap(typ), plain.GetVersionMap(typ)
		if len(gv) != len(wv) {
			t.Errorf("%s: version map %v, want %v", typ, gv, wv)
		}
		for k, v := range wv {
			if gv[k] != v {
				t.Errorf("%s: version map %v, want %v", typ, gv, wv)
			}
		}
	}
	if got := FromResourceSnapshot(plain); got.GetVersion(resource.ListenerType) != "v1" || len(got.GetResources(resource.ListenerType)) != 2 {
		t.Errorf("a go-control-plane snapshot converts to %v", got.GetResources(resource.ListenerType))
	}
	if err := s.SetType("type.googleapis.com/unknown", "v", shared); err == nil {
		t.Error("SetType took an unknown type")
	}
	if err := s.SetType(resource.ClusterType, "v", shared); err == nil || !strings.Contains(err.Error(), "given as") {
		t.Errorf("SetType took listeners as clusters: %v", err)
	}
}

// TestStatusKeysAndClear: a node is held from its first snapshot or watch
// until it is cleared.
func TestStatusKeysAndClear(t *testing.T) {
	c := New(cache.NewSnapshotCache(false, cache.IDHash{}, nil), slog.New(slog.DiscardHandler))
	newClient("w", resource.ListenerType).request(t, c)
	if err := c.SetSnapshot(t.Context(), "s", plainOf(t, "1")); err != nil {
		t.Fatal(err)
	}
	keys := c.GetStatusKeys()
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"s", "w"}) {
		t.Errorf("status keys %v, want [s w]", keys)
	}
	if _, err := c.GetSnapshot("s"); err != nil {
		t.Error(err)
	}
	c.ClearSnapshot("s")
	c.ClearSnapshot("w")
	if keys := c.GetStatusKeys(); len(keys) != 0 {
		t.Errorf("status keys %v after clearing", keys)
	}
	if _, err := c.GetSnapshot("s"); err == nil {
		t.Error("a cleared node's snapshot is still there")
	}
}

// TestSetHas: by scanning small sets and by index large ones.
func TestSetHas(t *testing.T) {
	for _, n := range []int{0, 3, 20} {
		var rs []types.Resource
		for i := range n {
			rs = append(rs, clusterOf(fmt.Sprintf("c%d", i)))
		}
		s := NewSet(resource.ClusterType, rs)
		for i := range n {
			if !s.Has(fmt.Sprintf("c%d", i)) {
				t.Errorf("set of %d lacks c%d", n, i)
			}
		}
		if s.Has("missing") || s.Has(fmt.Sprintf("c%d", n)) {
			t.Errorf("set of %d has a name it lacks", n)
		}
	}
}
