package limits

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// serve runs a real gRPC server (the health service) with l's limits on
// 127.0.0.1 and returns its address.
func serve(t *testing.T, l *Limiter) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(l.GRPCServerOptions()...)
	healthpb.RegisterHealthServer(g, health.NewServer())
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(l.Listen(lis)) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return lis.Addr().String()
}

// dialFrom connects to addr from the local address src (any 127/8 address
// is this host's loopback).
func dialFrom(t *testing.T, src, addr string) *grpc.ClientConn {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func check(ctx context.Context, conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// A flood of calls from one source is refused ResourceExhausted once its
// bucket is empty, and a flood of connections from it is closed at accept;
// another source still gets every call it makes.
func TestAFloodFromOneSourceDoesNotStarveAnother(t *testing.T) {
	l, err := New("test", Options{RequestsPerSecondPerSource: 1, RequestBurstPerSource: 5, MaxConnectionsPerSource: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, l)
	flood := dialFrom(t, "127.0.0.2", addr)
	exhausted := 0
	for range 50 {
		if err := check(t.Context(), flood); status.Code(err) == codes.ResourceExhausted {
			exhausted++
		} else if err != nil {
			t.Fatalf("flood call: %v", err)
		}
	}
	if exhausted < 40 {
		t.Errorf("%d of 50 flood calls refused, want at least 40 (burst 5, 1/s)", exhausted)
	}
	// Connections over the per-source cap are closed as they are accepted.
	for range 10 {
		_ = check(t.Context(), dialFrom(t, "127.0.0.2", addr))
	}
	if l.Refused(LimitSourceConnections) == 0 {
		t.Error("no connection from the flooding source was refused")
	}
	legit := dialFrom(t, "127.0.0.1", addr)
	for i := range 5 {
		if err := check(t.Context(), legit); err != nil {
			t.Fatalf("legitimate call %d from 127.0.0.1: %v", i, err)
		}
	}
	if got := l.Refused(LimitSourceRate); got < exhausted {
		t.Errorf("Refused(source_rate) = %d, want at least %d", got, exhausted)
	}
}

// The source table is bounded: idle sources are forgotten first, expired
// ones on the next look-up; a source holding connections is kept.
func TestSourceTableIsBounded(t *testing.T) {
	l, err := New("test", Options{MaxSources: 3, SourceExpiry: &metav1.Duration{Duration: time.Minute}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	holder := netip.MustParseAddr("10.0.0.1")
	release, limit := l.acquire(holder)
	if release == nil {
		t.Fatal(limit)
	}
	for i := range 100 {
		l.Allow(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}))
		if n := l.Sources(); n > 3 {
			t.Fatalf("%d sources remembered, bound 3", n)
		}
	}
	l.mu.Lock()
	_, kept := l.sources[holder]
	l.mu.Unlock()
	if !kept {
		t.Error("the source holding a connection was forgotten")
	}
	release()
	now = now.Add(2 * time.Minute)
	l.Allow(netip.MustParseAddr("10.2.0.1"))
	if n := l.Sources(); n != 1 {
		t.Errorf("%d sources after expiry, want 1", n)
	}
}

// Connections over the total cap are closed too, and a closed connection
// frees its place.
func TestConnectionCaps(t *testing.T) {
	l, err := New("test", Options{MaxConnections: 2, MaxConnectionsPerSource: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	r1, _ := l.acquire(a)
	r2, _ := l.acquire(b)
	if r1 == nil || r2 == nil {
		t.Fatal("first two connections refused")
	}
	if r, limit := l.acquire(b); r != nil || limit != LimitConnections {
		t.Fatalf("third connection: %v", limit)
	}
	r1()
	r1() // releasing twice frees one place
	if r, _ := l.acquire(b); r == nil {
		t.Fatal("a freed place was not reused")
	}
	if r, limit := l.acquire(a); r != nil || limit != LimitConnections {
		t.Fatalf("over the cap again: %v", limit)
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	for _, o := range []Options{{MaxConnectionsPerSource: -1}, {RequestsPerSecondPerSource: -1}, {MaxConnectionsPerSource: 5, MaxConnections: 4}, {KeepaliveTime: &metav1.Duration{Duration: -time.Second}}} {
		if _, err := New("test", o, nil); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}
