package adsclient_test

import (
	"errors"
	"net"
	"sync"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/embark-mesh/embark/test/adsclient"
)

// recorder keeps the requests and tokens a go-control-plane server was sent.
type recorder struct {
	mu     sync.Mutex
	tokens []string
	sotw   []*discovery.DiscoveryRequest
	delta  []*discovery.DeltaDiscoveryRequest
}

// interceptor records each request as it arrives, before the server fills
// in what the client left out, and the stream's token.
func (r *recorder) interceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	md, _ := metadata.FromIncomingContext(ss.Context())
	r.mu.Lock()
	r.tokens = append(r.tokens, md.Get("authorization")...)
	r.mu.Unlock()
	return handler(srv, &recordingStream{ServerStream: ss, r: r})
}

type recordingStream struct {
	grpc.ServerStream
	r *recorder
}

func (s *recordingStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	switch req := m.(type) {
	case *discovery.DiscoveryRequest:
		s.r.sotw = append(s.r.sotw, proto.Clone(req).(*discovery.DiscoveryRequest))
	case *discovery.DeltaDiscoveryRequest:
		s.r.delta = append(s.r.delta, proto.Clone(req).(*discovery.DeltaDiscoveryRequest))
	}
	return nil
}

// serve starts a go-control-plane ADS server and returns its snapshot
// cache, what it saw and a connection to it.
func serve(t *testing.T) (cache.SnapshotCache, *recorder, *grpc.ClientConn) {
	t.Helper()
	snaps := cache.NewSnapshotCache(false, cache.IDHash{}, nil)
	rec := &recorder{}
	srv := grpc.NewServer(grpc.StreamInterceptor(rec.interceptor))
	discovery.RegisterAggregatedDiscoveryServiceServer(srv, serverv3.NewServer(t.Context(), snaps, nil))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := adsclient.Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return snaps, rec, conn
}

func setListeners(t *testing.T, snaps cache.SnapshotCache, version string, names ...string) {
	t.Helper()
	var ls []types.Resource
	for _, n := range names {
		ls = append(ls, &listenerv3.Listener{Name: n})
	}
	snap, err := cache.NewSnapshot(version, map[resource.Type][]types.Resource{resource.ListenerType: ls})
	if err != nil {
		t.Fatal(err)
	}
	if err := snaps.SetSnapshot(t.Context(), "node-a", snap); err != nil {
		t.Fatal(err)
	}
}

// TestSotW: the token goes with the stream, the node with the first request
// only; an ACK repeats version, nonce and names; a receive that timed out
// still gets the next response; a NACK carries the last accepted version.
func TestSotW(t *testing.T) {
	snaps, rec, conn := serve(t)
	setListeners(t, snaps, "1", "l1")
	s, err := adsclient.OpenSotW(t.Context(), conn, "tok", &core.Node{Id: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Request(resource.ListenerType, "l1"); err != nil {
		t.Fatal(err)
	}
	first, err := s.Recv(0)
	if err != nil || first.GetVersionInfo() != "1" || len(first.GetResources()) != 1 {
		t.Fatalf("first response = %v, %v; want version 1 with one listener", first, err)
	}
	if err := s.ACK(first); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(1); !errors.Is(err, adsclient.ErrTimeout) {
		t.Fatalf("Recv with nothing to receive = %v, want ErrTimeout", err)
	}
	setListeners(t, snaps, "2", "l1")
	second, err := s.Recv(0)
	if err != nil || second.GetVersionInfo() != "2" {
		t.Fatalf("second response = %v, %v; want version 2", second, err)
	}
	if err := s.NACK(second, "bad listener"); err != nil {
		t.Fatal(err)
	}
	setListeners(t, snaps, "3", "l1") // a response after the NACK: every request was processed
	if _, err := s.Recv(0); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.tokens) != 1 || rec.tokens[0] != "Bearer tok" {
		t.Errorf("tokens = %q, want [Bearer tok]", rec.tokens)
	}
	if len(rec.sotw) != 3 {
		t.Fatalf("requests = %v, want request, ACK, NACK", rec.sotw)
	}
	req, ack, nack := rec.sotw[0], rec.sotw[1], rec.sotw[2]
	if req.GetNode().GetId() != "node-a" || ack.GetNode() != nil || nack.GetNode() != nil {
		t.Errorf("nodes = %v, %v, %v; want node-a on the first request only", req.GetNode(), ack.GetNode(), nack.GetNode())
	}
	if ack.GetVersionInfo() != "1" || ack.GetResponseNonce() != first.GetNonce() || len(ack.GetResourceNames()) != 1 || ack.GetErrorDetail() != nil {
		t.Errorf("ACK = %v, want version 1, nonce %q, names [l1]", ack, first.GetNonce())
	}
	if nack.GetVersionInfo() != "1" || nack.GetResponseNonce() != second.GetNonce() || nack.GetErrorDetail().GetMessage() != "bad listener" {
		t.Errorf("NACK = %v, want version 1, nonce %q, detail", nack, second.GetNonce())
	}
}

// TestDelta: the node goes with the first request only; an ACK and a NACK
// carry the response's type and nonce, the NACK an error detail.
func TestDelta(t *testing.T) {
	snaps, rec, conn := serve(t)
	setListeners(t, snaps, "1", "l1")
	d, err := adsclient.OpenDelta(t.Context(), conn, "", &core.Node{Id: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Subscribe(resource.ListenerType); err != nil {
		t.Fatal(err)
	}
	first, err := d.Recv(0)
	if err != nil || len(first.GetResources()) != 1 {
		t.Fatalf("first response = %v, %v; want one listener", first, err)
	}
	if err := d.ACK(first); err != nil {
		t.Fatal(err)
	}
	setListeners(t, snaps, "2", "l1", "l2")
	second, err := d.Recv(0)
	if err != nil || len(second.GetResources()) != 1 || second.GetResources()[0].GetName() != "l2" {
		t.Fatalf("second response = %v, %v; want l2", second, err)
	}
	if err := d.NACK(second, "bad listener"); err != nil {
		t.Fatal(err)
	}
	setListeners(t, snaps, "3", "l1")
	if _, err := d.Recv(0); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.tokens) != 0 {
		t.Errorf("tokens = %q, want none", rec.tokens)
	}
	if len(rec.delta) != 3 {
		t.Fatalf("requests = %v, want subscribe, ACK, NACK", rec.delta)
	}
	sub, ack, nack := rec.delta[0], rec.delta[1], rec.delta[2]
	if sub.GetNode().GetId() != "node-a" || ack.GetNode() != nil || nack.GetNode() != nil {
		t.Errorf("nodes = %v, %v, %v; want node-a on the first request only", sub.GetNode(), ack.GetNode(), nack.GetNode())
	}
	if ack.GetResponseNonce() != first.GetNonce() || ack.GetTypeUrl() != resource.ListenerType || ack.GetErrorDetail() != nil {
		t.Errorf("ACK = %v, want nonce %q", ack, first.GetNonce())
	}
	if nack.GetResponseNonce() != second.GetNonce() || nack.GetErrorDetail().GetMessage() != "bad listener" {
		t.Errorf("NACK = %v, want nonce %q and detail", nack, second.GetNonce())
	}
}

// TestSotWChangedSubscription: a request after an ACK carries the type's
// accepted version and last nonce, as Envoy's subscription changes do.
func TestSotWChangedSubscription(t *testing.T) {
	snaps, rec, conn := serve(t)
	setListeners(t, snaps, "1", "l1", "l2")
	s, err := adsclient.OpenSotW(t.Context(), conn, "", &core.Node{Id: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Request(resource.ListenerType, "l1"); err != nil {
		t.Fatal(err)
	}
	first, err := s.Recv(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ACK(first); err != nil {
		t.Fatal(err)
	}
	if err := s.Request(resource.ListenerType, "l1", "l2"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(0); err != nil { // the answer: every request was read
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.sotw) != 3 {
		t.Fatalf("requests = %v, want request, ACK, changed request", rec.sotw)
	}
	changed := rec.sotw[2]
	if changed.GetVersionInfo() != "1" || changed.GetResponseNonce() != first.GetNonce() || len(changed.GetResourceNames()) != 2 {
		t.Errorf("changed request = %v, want version 1, nonce %q, names [l1 l2]", changed, first.GetNonce())
	}
}
