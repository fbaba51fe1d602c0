package relay

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// names returns n names prefix-0 ... prefix-(n-1).
func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

func TestSubscriptionLimits(t *testing.T) {
	const eds, rds = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment", "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
	limits := Limits{MaxNamesPerType: 10, MaxNameBytesPerStream: 100}
	tests := []struct {
		name      string
		sotw      []*discovery.DiscoveryRequest
		delta     []*discovery.DeltaDiscoveryRequest
		wantErr   string // of the last request; "" accepts every request
		wantNames int    // held after the last request
	}{
		{name: "sotw within", sotw: []*discovery.DiscoveryRequest{{TypeUrl: eds, ResourceNames: names("a", 10)}}, wantNames: 10},
		{name: "sotw over the names of a type", sotw: []*discovery.DiscoveryRequest{{TypeUrl: eds, ResourceNames: names("a", 11)}},
			wantErr: "11 resource names of type " + eds + " exceeds the limit of 10 names per type"},
		{name: "sotw replaces its type's names", sotw: []*discovery.DiscoveryRequest{
			{TypeUrl: eds, ResourceNames: names("a", 10)}, {TypeUrl: eds, ResourceNames: names("b", 10)}, {TypeUrl: eds, ResourceNames: names("c", 3)},
		}, wantNames: 3},
		// 10 names of 3 bytes per type: 30 bytes; the fourth type makes 120.
		{name: "sotw over the bytes of a stream", sotw: []*discovery.DiscoveryRequest{
			{TypeUrl: "t1", ResourceNames: names("a", 10)}, {TypeUrl: "t2", ResourceNames: names("a", 10)},
			{TypeUrl: "t3", ResourceNames: names("a", 10)}, {TypeUrl: "t4", ResourceNames: names("a", 10)},
		}, wantErr: "type t4 brings the stream's resource names to 120 bytes, over the limit of 100 bytes per stream", wantNames: 30},
		{name: "delta within", delta: []*discovery.DeltaDiscoveryRequest{{TypeUrl: eds, ResourceNamesSubscribe: names("a", 10)}}, wantNames: 10},
		{name: "delta accumulates over the names of a type", delta: []*discovery.DeltaDiscoveryRequest{
			{TypeUrl: eds, ResourceNamesSubscribe: names("a", 6)}, {TypeUrl: eds, ResourceNamesSubscribe: names("b", 5)},
		}, wantErr: "11 resource names of type " + eds, wantNames: 6},
		{name: "delta duplicates count once", delta: []*discovery.DeltaDiscoveryRequest{
			{TypeUrl: eds, ResourceNamesSubscribe: names("a", 6)}, {TypeUrl: eds, ResourceNamesSubscribe: names("a", 10)},
		}, wantNames: 10},
		{name: "delta unsubscribing makes room in the same request", delta: []*discovery.DeltaDiscoveryRequest{
			{TypeUrl: eds, ResourceNamesSubscribe: names("a", 10)},
			{TypeUrl: eds, ResourceNamesSubscribe: names("b", 10), ResourceNamesUnsubscribe: names("a", 10)},
		}, wantNames: 10},
		{name: "delta subscribe and unsubscribe of *", delta: []*discovery.DeltaDiscoveryRequest{
			{TypeUrl: rds, ResourceNamesSubscribe: []string{"*"}, ResourceNamesUnsubscribe: []string{"*"}},
		}, wantNames: 0},
		{name: "delta initial versions over the names of a type", delta: []*discovery.DeltaDiscoveryRequest{
			{TypeUrl: eds, InitialResourceVersions: maps.Collect(func(yield func(string, string) bool) {
				for _, n := range names("a", 11) {
					yield(n, "1")
				}
			})},
		}, wantErr: "11 resource names of type " + eds},
		{name: "delta initial versions count as bytes", delta: []*discovery.DeltaDiscoveryRequest{
			{TypeUrl: eds, ResourceNamesSubscribe: names("a", 10)},
			{TypeUrl: rds, InitialResourceVersions: map[string]string{"r": strings.Repeat("v", 80)}},
		}, wantErr: "type " + rds + " brings the stream's resource names to 111 bytes", wantNames: 10},
		{name: "delta the limits are per type", delta: []*discovery.DeltaDiscoveryRequest{
			{TypeUrl: eds, ResourceNamesSubscribe: names("a", 10)}, {TypeUrl: rds, ResourceNamesSubscribe: names("a", 10)},
		}, wantNames: 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var total atomic.Int64
			var err error
			var subs interface {
				Names() int
				Release()
			}
			var resync func() int // the names a resynchronisation would send
			if tt.sotw != nil {
				s := newSotwState(limits, &total)
				for _, r := range tt.sotw {
					if err = s.Observe(r); err != nil {
						break
					}
				}
				subs = s
				resync = func() int {
					n := 0
					for _, r := range s.resync(DefaultMaxRequestBytes, 0) {
						n += len(r.GetResourceNames())
					}
					return n
				}
			} else {
				s := newDeltaState(limits, &total)
				for _, r := range tt.delta {
					if err = s.Observe(r); err != nil {
						break
					}
				}
				subs = s
				resync = func() int {
					n := 0
					for _, r := range s.resync(DefaultMaxRequestBytes, 0) {
						n += len(r.GetResourceNamesSubscribe())
					}
					return n
				}
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.wantErr != "" && (status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("err %v, want ResourceExhausted with %q", err, tt.wantErr)
			}
			if got := subs.Names(); got != tt.wantNames {
				t.Errorf("Names() = %d, want %d (a refused request keeps nothing)", got, tt.wantNames)
			}
			if got := total.Load(); got != int64(tt.wantNames) {
				t.Errorf("relay total %d, want %d", got, tt.wantNames)
			}
			if tt.sotw != nil || tt.wantNames > 0 {
				if got := resync(); got != tt.wantNames {
					t.Errorf("resync subscribes to %d names, want %d", got, tt.wantNames)
				}
			}
			subs.Release()
			if total.Load() != 0 || subs.Names() != 0 {
				t.Errorf("after Release: total %d, Names %d, want 0", total.Load(), subs.Names())
			}
		})
	}
}

// A refused Delta request leaves the subscription as it was: an
// unsubscription in it is undone too.
func TestRefusedDeltaRequestIsUndone(t *testing.T) {
	s := newDeltaState(Limits{MaxNamesPerType: 5}, nil)
	if err := s.Observe(&discovery.DeltaDiscoveryRequest{TypeUrl: "t", ResourceNamesSubscribe: names("a", 5)}); err != nil {
		t.Fatal(err)
	}
	err := s.Observe(&discovery.DeltaDiscoveryRequest{TypeUrl: "t", ResourceNamesSubscribe: names("b", 5), ResourceNamesUnsubscribe: names("a", 2)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("err %v, want ResourceExhausted", err)
	}
	if got := slices.Sorted(maps.Keys(s.subs["t"].names)); !slices.Equal(got, slices.Sorted(slices.Values(names("a", 5)))) {
		t.Errorf("names after the refusal %v, want a-0..a-4", got)
	}
}

func TestDeltaResyncSplits(t *testing.T) {
	versioned := func(ns []string) map[string]string {
		m := map[string]string{}
		for _, n := range ns {
			m[n] = "2026-05-01T00:00:00Z/42"
		}
		return m
	}
	tests := []struct {
		name         string
		subscribe    []string
		versions     map[string]string // accepted, as istiod's answers leave them
		maxBytes     int
		reserve      int
		wantRequests int // at least
	}{
		{name: "fits in one", subscribe: names("outbound|9080||svc.ns.svc.cluster.local", 10), maxBytes: DefaultMaxRequestBytes, wantRequests: 1},
		{name: "names split", subscribe: names("outbound|9080||svc.ns.svc.cluster.local", 2000), maxBytes: 16 << 10, wantRequests: 6},
		{name: "names and versions split", subscribe: names("n", 3000), versions: versioned(names("n", 3000)), maxBytes: 8 << 10, wantRequests: 10},
		{name: "wildcard with versions split", subscribe: []string{"*"}, versions: versioned(names("cluster", 3000)), maxBytes: 8 << 10, wantRequests: 10},
		{name: "the node's reserve", subscribe: names("n", 3000), maxBytes: 8 << 10, reserve: 7 << 10, wantRequests: 4},
		{name: "a name over the limit goes alone", subscribe: []string{strings.Repeat("x", 300), "a"}, maxBytes: 100, wantRequests: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newDeltaState(Limits{MaxNamesPerType: 100_000, MaxNameBytesPerStream: MaxNameBytesPerStreamLimit}, nil)
			const typ = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
			if err := s.Observe(&discovery.DeltaDiscoveryRequest{TypeUrl: typ, ResourceNamesSubscribe: tt.subscribe}); err != nil {
				t.Fatal(err)
			}
			if err := s.Observe(&discovery.DeltaDiscoveryRequest{TypeUrl: "other", ResourceNamesSubscribe: []string{"o"}}); err != nil {
				t.Fatal(err)
			}
			maps.Copy(s.subs[typ].versions, tt.versions)
			reqs := s.resync(tt.maxBytes, tt.reserve)
			if len(reqs) < tt.wantRequests+1 {
				t.Errorf("%d requests, want at least %d for the type and 1 for the other", len(reqs), tt.wantRequests)
			}
			checkDeltaResync(t, s, reqs, tt.maxBytes)
			for i, r := range reqs {
				limit := tt.maxBytes
				if i == 0 {
					limit -= tt.reserve
				}
				if n := proto.Size(r); n > limit && len(r.GetResourceNamesSubscribe())+len(r.GetInitialResourceVersions()) > 1 {
					t.Errorf("request %d of %d bytes, over its budget of %d", i, n, limit)
				}
			}
		})
	}
}

// checkDeltaResync checks that reqs restore s: per type, the names and
// versions of s exactly, the type's first request subscribing to names
// first when it has any, no request over maxBytes unless it holds one name
// or version only, and every later request of a type subscribing to or
// versioning names not sent before.
func checkDeltaResync(t *testing.T, s *deltaState, reqs []*discovery.DeltaDiscoveryRequest, maxBytes int) {
	t.Helper()
	got := map[string]*deltaSub{}
	var order []string
	for i, r := range reqs {
		typ := r.GetTypeUrl()
		sub := got[typ]
		if sub == nil {
			sub = &deltaSub{names: map[string]struct{}{}, versions: map[string]string{}}
			got[typ] = sub
			order = append(order, typ)
			if len(s.subs[typ].names) > 0 && len(r.GetResourceNamesSubscribe()) == 0 {
				t.Fatalf("the first request of type %q subscribes to no name: istiod would take it as a wildcard", typ)
			}
		} else if len(r.GetResourceNamesSubscribe())+len(r.GetInitialResourceVersions()) == 0 {
			t.Fatalf("request %d of type %q adds nothing", i, typ)
		}
		for _, n := range r.GetResourceNamesSubscribe() {
			if _, dup := sub.names[n]; dup {
				t.Fatalf("name %q of type %q sent twice", n, typ)
			}
			sub.names[n] = struct{}{}
		}
		for n, v := range r.GetInitialResourceVersions() {
			if _, dup := sub.versions[n]; dup {
				t.Fatalf("version of %q of type %q sent twice", n, typ)
			}
			sub.versions[n] = v
		}
		if proto.Size(r) > maxBytes && len(r.GetResourceNamesSubscribe())+len(r.GetInitialResourceVersions()) > 1 {
			t.Fatalf("request %d of %d bytes over the limit of %d", i, proto.Size(r), maxBytes)
		}
	}
	if !slices.Equal(order, s.order) {
		t.Fatalf("types resynchronised %v, want %v", order, s.order)
	}
	for typ, want := range s.subs {
		if !maps.Equal(got[typ].names, want.names) || !maps.Equal(got[typ].versions, want.versions) {
			t.Fatalf("type %q resynchronised %d names and %d versions, want %d and %d", typ, len(got[typ].names), len(got[typ].versions), len(want.names), len(want.versions))
		}
	}
}
