package endpoint

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

func fromPeer(ctx context.Context, addr string) context.Context {
	ap := netip.MustParseAddrPort(addr)
	return peer.NewContext(ctx, &peer.Peer{Addr: net.TCPAddrFromAddrPort(ap)})
}

func TestSourceCheck(t *testing.T) {
	proxy := netip.MustParsePrefix("10.200.0.0/16")
	tests := []struct {
		name     string
		check    SourceCheck
		peer     string
		addr     string
		wantCode codes.Code
	}{
		{name: "off", check: SourceCheck{}, peer: "192.0.2.9:4000", addr: "10.0.0.5", wantCode: codes.OK},
		{name: "source is the workload", check: SourceCheck{Enabled: true}, peer: "10.0.0.5:4000", addr: "10.0.0.5", wantCode: codes.OK},
		{name: "IPv4-mapped source is the workload", check: SourceCheck{Enabled: true}, peer: "[::ffff:10.0.0.5]:4000", addr: "10.0.0.5", wantCode: codes.OK},
		{name: "another source", check: SourceCheck{Enabled: true}, peer: "192.0.2.9:4000", addr: "10.0.0.5", wantCode: codes.PermissionDenied},
		{name: "trusted proxy", check: SourceCheck{Enabled: true, TrustedProxies: []netip.Prefix{proxy}}, peer: "10.200.1.1:4000", addr: "10.0.0.5", wantCode: codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Server{opts: Options{Source: tt.check}}
			err := s.checkSource(fromPeer(t.Context(), tt.peer), netip.MustParseAddr(tt.addr))
			if got := status.Code(err); got != tt.wantCode {
				t.Errorf("checkSource = %v, want %v", err, tt.wantCode)
			}
		})
	}
}

func TestVerifyLimitIsPerSource(t *testing.T) {
	l := newSourceLimiter(RateLimit{PerSecond: 0.001, Burst: 2, Sources: 2})
	a, b := fromPeer(t.Context(), "192.0.2.1:1"), fromPeer(t.Context(), "192.0.2.2:1")
	for i := range 2 {
		if !l.allow(a) {
			t.Fatalf("request %d of a burst of 2 refused", i+1)
		}
	}
	if l.allow(a) {
		t.Error("third request within the burst window allowed")
	}
	if !l.allow(b) {
		t.Error("another source is limited by the first one's flood")
	}
	// A third source evicts one; the map stays bounded.
	l.allow(fromPeer(t.Context(), "192.0.2.3:1"))
	if len(l.seen) > 2 {
		t.Errorf("%d sources tracked, want at most 2", len(l.seen))
	}
}
