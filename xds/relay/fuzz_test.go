package relay

import (
	"slices"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// FuzzParseNonce: a sidecar's response nonce is outside input. Any string
// parses without panicking, and what the relay sends parses back.
func FuzzParseNonce(f *testing.F) {
	for _, s := range []string{"", ":", "1:abc", "18446744073709551615:x", "18446744073709551616:x", "-1:x", "1:2:3", "a:b"} {
		f.Add(s, uint64(1))
	}
	f.Fuzz(func(t *testing.T, s string, gen uint64) {
		_, _, _ = parseNonce(s)
		g, n, ok := parseNonce(genNonce(gen, s))
		if !ok || g != gen || n != s {
			t.Fatalf("parseNonce(genNonce(%d, %q)) = %d, %q, %v", gen, s, g, n, ok)
		}
	})
}

// FuzzDeltaRequests: any sequence of Delta requests from a sidecar, and of
// responses, keeps the state consistent: bounded pending responses, a
// resync of every type the sidecar asked for that restores its names and
// versions, split under any message limit (a request over it holds one
// name or version only).
func FuzzDeltaRequests(f *testing.F) {
	seed, _ := proto.Marshal(&discovery.DeltaDiscoveryRequest{TypeUrl: "t", ResourceNamesSubscribe: []string{"a"}, ResponseNonce: "1:n"})
	f.Add(seed, seed, uint8(3))
	f.Fuzz(func(t *testing.T, a, b []byte, responses uint8) {
		s := newDeltaState(Limits{}, nil)
		for _, data := range [][]byte{a, b} {
			req := &discovery.DeltaDiscoveryRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			if err := s.Observe(req); err != nil {
				if status.Code(err) != codes.ResourceExhausted {
					t.Fatalf("refused %v", err)
				}
				continue
			}
			_ = s.upstream(req, 1)
			for k := range responses % 40 {
				s.sent(&discovery.DeltaDiscoveryResponse{TypeUrl: req.GetTypeUrl(), Nonce: genNonce(1, string(rune('a'+k)))})
			}
		}
		for typ, sub := range s.subs {
			if len(sub.pending) > maxPending {
				t.Fatalf("type %q keeps %d pending responses", typ, len(sub.pending))
			}
		}
		for _, limit := range []int{DefaultMaxRequestBytes, 64} {
			checkDeltaResync(t, s, s.resync(limit, 0), limit)
		}
		// Under tight limits, whatever is accepted stays within them and
		// the count of names held is exactly what the state keeps.
		tight := newDeltaState(Limits{MaxNamesPerType: 3, MaxNameBytesPerStream: 24}, nil)
		for _, data := range [][]byte{a, b, a} {
			req := &discovery.DeltaDiscoveryRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_ = tight.Observe(req)
		}
		held := 0
		for typ, sub := range tight.subs {
			if len(sub.names) > 3 || sub.initial > 3 {
				t.Fatalf("type %q holds %d names and %d initial versions, over the limit of 3", typ, len(sub.names), sub.initial)
			}
			held += len(sub.names) + sub.initial
		}
		if tight.Names() != held || tight.use.bytes > 24 {
			t.Fatalf("Names() = %d for %d held, %d bytes (limit 24)", tight.Names(), held, tight.use.bytes)
		}
	})
}

// FuzzSotwRequests: whatever SotW requests a sidecar sends (type URLs,
// resource names, versions, nonces), the relay keeps one subscription per
// type with the latest request's names and version, resynchronises exactly
// those, and relays a nonce only when it belongs to the current upstream
// stream (its generation prefix stripped).
func FuzzSotwRequests(f *testing.F) {
	seed, _ := proto.Marshal(&discovery.DiscoveryRequest{TypeUrl: "t", ResourceNames: []string{"a", "b"}, VersionInfo: "1", ResponseNonce: genNonce(1, "n")})
	other, _ := proto.Marshal(&discovery.DiscoveryRequest{TypeUrl: "t", ResponseNonce: genNonce(2, "n")})
	f.Add(seed, other)
	f.Fuzz(func(t *testing.T, a, b []byte) {
		s := newSotwState(Limits{}, nil)
		latest := map[string]*discovery.DiscoveryRequest{}
		for _, data := range [][]byte{a, b} {
			req := &discovery.DiscoveryRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			if err := s.Observe(req); err != nil {
				if status.Code(err) != codes.ResourceExhausted {
					t.Fatalf("refused %v", err)
				}
				continue
			}
			latest[req.GetTypeUrl()] = proto.Clone(req).(*discovery.DiscoveryRequest)
			nonce := req.GetResponseNonce()
			relayed := s.upstream(req, 1)
			g, n, ok := parseNonce(nonce)
			switch {
			case nonce == "":
				if !relayed {
					t.Fatal("a request without a nonce was dropped")
				}
			case ok && g == 1:
				if !relayed || req.GetResponseNonce() != n {
					t.Fatalf("nonce %q of this stream: relayed=%v as %q, want %q", nonce, relayed, req.GetResponseNonce(), n)
				}
			default:
				if relayed {
					t.Fatalf("nonce %q of another upstream stream was relayed", nonce)
				}
			}
		}
		resync := s.resync(DefaultMaxRequestBytes, 0)
		if len(resync) != len(latest) {
			t.Fatalf("resync of %d types, %d asked for", len(resync), len(latest))
		}
		for _, r := range resync {
			want := latest[r.GetTypeUrl()]
			if want == nil || !slices.Equal(r.GetResourceNames(), want.GetResourceNames()) || r.GetVersionInfo() != want.GetVersionInfo() || r.GetResponseNonce() != "" {
				t.Fatalf("resync %v, want the names and version of %v and no nonce", r, want)
			}
		}
	})
}

// FuzzUpstreamNode: the node relayed to istiod is decoded from what a
// sidecar (or Hooks.Node) produced. Any bytes decode without panicking, and
// a decoded node never carries the auto-registration keys.
func FuzzUpstreamNode(f *testing.F) {
	seed, _ := proto.Marshal(&core.Node{Id: "sidecar~10.0.0.5~vm1.demo~demo.svc.cluster.local", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"AUTO_REGISTER_GROUP": structpb.NewStringValue("ratings"), "WORKLOAD_ENTRY": structpb.NewStringValue("vm1"), "ISTIO_VERSION": structpb.NewStringValue("1.30.0"),
	}}})
	f.Add(seed)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, wire []byte) {
		n, err := upstreamNode(wire)
		if err != nil {
			return
		}
		for _, k := range strippedMetadata {
			if _, ok := n.GetMetadata().GetFields()[k]; ok {
				t.Fatalf("metadata %s kept", k)
			}
		}
	})
}
