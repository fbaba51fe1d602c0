package configsource

import (
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

func snapOf(t *testing.T, clusters []types.Resource, listeners []types.Resource) map[resource.Type]string {
	t.Helper()
	snap, err := versioned(map[resource.Type][]types.Resource{resource.ClusterType: clusters, resource.ListenerType: listeners, resource.RouteType: nil})
	if err != nil {
		t.Fatal(err)
	}
	return map[resource.Type]string{
		resource.ClusterType:  snap.GetVersion(resource.ClusterType),
		resource.ListenerType: snap.GetVersion(resource.ListenerType),
		resource.RouteType:    snap.GetVersion(resource.RouteType),
	}
}

func TestVersionsAreContentHashesPerType(t *testing.T) {
	a := &clusterv3.Cluster{Name: "a", ConnectTimeout: durationpb.New(1e9)}
	b := &clusterv3.Cluster{Name: "b"}
	l := &listenerv3.Listener{Name: "l"}
	base := snapOf(t, []types.Resource{a, b}, []types.Resource{l})
	if v := base[resource.ClusterType]; v == "" || v == base[resource.ListenerType] {
		t.Fatalf("versions %v: want distinct non-empty versions per type", base)
	}
	tests := []struct {
		name        string
		clusters    []types.Resource
		listeners   []types.Resource
		wantChanged []resource.Type
	}{
		{name: "same content", clusters: []types.Resource{a, b}, listeners: []types.Resource{l}},
		{name: "same content, other order", clusters: []types.Resource{b, a}, listeners: []types.Resource{l}},
		{name: "equal copies", clusters: []types.Resource{&clusterv3.Cluster{Name: "a", ConnectTimeout: durationpb.New(1e9)}, &clusterv3.Cluster{Name: "b"}}, listeners: []types.Resource{&listenerv3.Listener{Name: "l"}}},
		{name: "a cluster changed", clusters: []types.Resource{&clusterv3.Cluster{Name: "a", ConnectTimeout: durationpb.New(2e9)}, b}, listeners: []types.Resource{l}, wantChanged: []resource.Type{resource.ClusterType}},
		{name: "a cluster removed", clusters: []types.Resource{a}, listeners: []types.Resource{l}, wantChanged: []resource.Type{resource.ClusterType}},
		{name: "a listener renamed", clusters: []types.Resource{a, b}, listeners: []types.Resource{&listenerv3.Listener{Name: "m"}}, wantChanged: []resource.Type{resource.ListenerType}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := snapOf(t, tt.clusters, tt.listeners)
			for _, typ := range []resource.Type{resource.ClusterType, resource.ListenerType, resource.RouteType} {
				changed := got[typ] != base[typ]
				want := false
				for _, w := range tt.wantChanged {
					want = want || w == typ
				}
				if changed != want {
					t.Errorf("%s version changed = %v, want %v (%s -> %s)", typ, changed, want, base[typ], got[typ])
				}
			}
		})
	}
}
