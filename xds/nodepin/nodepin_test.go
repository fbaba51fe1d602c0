package nodepin

import (
	"errors"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

func TestCheck(t *testing.T) {
	first := &core.Node{Id: "sidecar~10.0.0.5~a.ns~ns.svc.cluster.local", Cluster: "a.ns",
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"NAMESPACE": structpb.NewStringValue("ns")}}}
	other := &core.Node{Id: "sidecar~10.0.0.6~b.ns~ns.svc.cluster.local"}
	sameIDOtherMeta := &core.Node{Id: first.Id, Cluster: "a.ns",
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"NAMESPACE": structpb.NewStringValue("other")}}}
	tests := []struct {
		name    string
		req     any
		refused bool
	}{
		{name: "same node, SotW", req: &discovery.DiscoveryRequest{Node: first}},
		{name: "same node, Delta", req: &discovery.DeltaDiscoveryRequest{Node: first}},
		{name: "no node", req: &discovery.DiscoveryRequest{}},
		{name: "another node ID", req: &discovery.DiscoveryRequest{Node: other}, refused: true},
		{name: "same ID, other metadata", req: &discovery.DeltaDiscoveryRequest{Node: sameIDOtherMeta}, refused: true},
		{name: "not an xDS request", req: "junk"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var g Guard
			g.Pin(first)
			err := g.Check(tt.req)
			if (err != nil) != tt.refused || (err != nil && !errors.Is(err, ErrSwitched)) {
				t.Fatalf("Check = %v, want refused %v", err, tt.refused)
			}
		})
	}
}

// TestZeroGuardPinsTheFirstRequest: a debug stream's guard pins whatever its
// first checked request carries, and holds later requests to it.
func TestZeroGuardPinsTheFirstRequest(t *testing.T) {
	var g Guard
	if err := g.Check(&discovery.DiscoveryRequest{Node: &core.Node{Id: "a"}}); err != nil {
		t.Fatalf("first request refused: %v", err)
	}
	if err := g.Check(&discovery.DiscoveryRequest{Node: &core.Node{Id: "b"}}); !errors.Is(err, ErrSwitched) {
		t.Fatalf("second request with another node: %v, want ErrSwitched", err)
	}
}
