package limits

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// selfSigned returns a serving configuration for 127.0.0.1 and the pool
// that verifies it.
func selfSigned(t *testing.T) (*tls.Config, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "limits test"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:   time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}, pool
}

// A server with TLSServerOptions (no read buffer of the transport's own: it
// reads straight from the TLS connection) reads requests of every size
// whole: smaller than a TLS record, larger than one, larger than the 32 KiB
// read buffer it does without, and many in a row on one connection.
func TestTLSServerReadsWithoutItsOwnBuffer(t *testing.T) {
	l, err := New("test", Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	serving, roots := selfSigned(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(append(l.GRPCServerOptions(), TLSServerOptions(serving)...)...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(l.Listen(lis)) }()
	t.Cleanup(func() { g.Stop(); <-done })

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	client := healthpb.NewHealthClient(conn)
	for _, size := range []int{1, 1 << 10, 20 << 10, 40 << 10, 200 << 10} {
		name := strings.Repeat("s", size)
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
		for i := range 3 {
			resp, err := client.Check(t.Context(), &healthpb.HealthCheckRequest{Service: name})
			if err != nil {
				t.Fatalf("Check of a %d-byte name (%d): %v", size, i, err)
			}
			if resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
				t.Fatalf("Check of a %d-byte name (%d) = %v, want NOT_SERVING (the name read whole)", size, i, resp.GetStatus())
			}
		}
		// A name that differs in its last byte is another service: the server
		// read the name exactly.
		if _, err := client.Check(t.Context(), &healthpb.HealthCheckRequest{Service: name[1:] + "t"}); status.Code(err) != codes.NotFound {
			t.Fatalf("Check of another %d-byte name = %v, want NotFound", size, err)
		}
	}
}
