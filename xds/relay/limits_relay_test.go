package relay_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/xds/relay"
)

func endpointNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("outbound|9080||%s-%d.demo.svc.cluster.local", prefix, i)
	}
	return out
}

func openDelta(t *testing.T, f *frontend) discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer sidecar-token")
	s, err := discovery.NewAggregatedDiscoveryServiceClient(dialFrontend(t, f)).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A Delta stream that subscribes past its limit is ended ResourceExhausted
// naming the type and the limit; istiod never sees the names over it, and
// the relay holds none of the stream's names once it ended.
func TestSubscriptionOverTheLimitEndsTheStream(t *testing.T) {
	u := startUpstream(t)
	f := startFrontendWith(t, u, relay.Options{Limits: relay.Limits{MaxNamesPerType: 100}})
	s := openDelta(t, f)
	if err := s.Send(&discovery.DeltaDiscoveryRequest{Node: sidecarNode(), TypeUrl: resource.EndpointType, ResourceNamesSubscribe: endpointNames("a", 60)}); err != nil {
		t.Fatal(err)
	}
	fixtures.Eventually(t, 30*time.Second, "the first subscription upstream", func() bool {
		_, _, _, _, deltas := u.snapshot()
		return len(deltas) == 1
	})
	if got := f.relay.SubscribedNames(); got != 60 {
		t.Fatalf("the relay holds %d names, want 60", got)
	}
	if err := s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: endpointNames("b", 41)}); err != nil {
		t.Fatal(err)
	}
	_, err := s.Recv()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), resource.EndpointType) || !strings.Contains(err.Error(), "limit of 100 names per type") {
		t.Fatalf("over the limit: %v, want ResourceExhausted naming the type and the limit", err)
	}
	fixtures.Eventually(t, 30*time.Second, "the relay to forget the stream's names", func() bool { return f.relay.SubscribedNames() == 0 })
	_, _, _, _, deltas := u.snapshot()
	for _, d := range deltas {
		for _, n := range d.GetResourceNamesSubscribe() {
			if strings.Contains(n, "|b-") {
				t.Fatalf("a name of the refused request reached istiod: %s", n)
			}
		}
	}
}

// When istiod comes back, the relay restores a large Delta subscription in
// requests under its message limit that together carry every name.
func TestDeltaResyncIsSplitUnderTheMessageLimit(t *testing.T) {
	const limit = 16 << 10
	u := startUpstream(t)
	f := startFrontendWith(t, u, relay.Options{MaxRequestBytes: limit})
	s := openDelta(t, f)
	all := endpointNames("svc", 3000) // about 150 KiB of names
	for i := 0; i < len(all); i += 500 {
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: all[i : i+500]}
		if i == 0 {
			req.Node = sidecarNode()
		}
		if err := s.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	// Requests sent before the first upstream stream opened reach it in
	// its resynchronisation: count names, not requests.
	subscribed := func(deltas []*discovery.DeltaDiscoveryRequest) int {
		n := 0
		for _, d := range deltas {
			n += len(d.GetResourceNamesSubscribe())
		}
		return n
	}
	before := 0
	fixtures.Eventually(t, 30*time.Second, "the subscription upstream", func() bool {
		_, _, _, _, deltas := u.snapshot()
		before = len(deltas)
		return subscribed(deltas) == len(all)
	})
	u.stop()
	u.restart(t)
	fixtures.Eventually(t, 30*time.Second, "the resynchronisation of every name", func() bool {
		_, _, _, _, deltas := u.snapshot()
		return subscribed(deltas[before:]) == len(all)
	})
	_, _, nodes, _, deltas := u.snapshot()
	resync := deltas[before:]
	if want := (3000*len(all[0]) + limit - 1) / limit; len(resync) < want {
		t.Errorf("resynchronised in %d requests, want at least %d of at most %d bytes", len(resync), want, limit)
	}
	seen := map[string]bool{}
	for i, d := range resync {
		if n := proto.Size(d); n > limit {
			t.Errorf("resync request %d is %d bytes, over %d", i, n, limit)
		}
		for _, n := range d.GetResourceNamesSubscribe() {
			seen[n] = true
		}
	}
	if len(seen) != len(all) {
		t.Errorf("resynchronised %d distinct names, want %d", len(seen), len(all))
	}
	if len(nodes) != 2 || nodes[1].GetId() != nodeID {
		t.Errorf("upstream nodes %v, want the sidecar's on both streams", nodes)
	}
}
