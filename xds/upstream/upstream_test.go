package upstream

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// testCA is a CA and a serving certificate it issued for dnsName.
type testCA struct {
	rootPEM []byte
	serving tls.Certificate
}

func newTestCA(t *testing.T, dnsName string) testCA {
	t.Helper()
	return newTestCAUntil(t, dnsName, time.Now().Add(time.Hour))
}

// newTestCAUntil is newTestCA with a root that expires at notAfter.
func newTestCAUntil(t *testing.T, dnsName string, notAfter time.Time) testCA {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test root"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), DNSNames: []string{dnsName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{
		rootPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		serving: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
	}
}

// serve runs a gRPC health server with cert on loopback.
func serve(t *testing.T, cert tls.Certificate) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

func check(t *testing.T, opts Options) error {
	t.Helper()
	conn, err := Dial(t.Context(), opts)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer func() { _ = conn.Close() }()
	_, err = healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false))
	return err
}

func TestDialVerifiesIstiod(t *testing.T) {
	good := newTestCA(t, "istiod.istio-system.svc")
	other := newTestCA(t, "istiod.istio-system.svc")
	addr := serve(t, good.serving)
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name       string
		roots      []byte
		serverName string
		wantErr    string
	}{
		{name: "istiod's roots and name", roots: good.rootPEM, serverName: "istiod.istio-system.svc"},
		{name: "another CA", roots: other.rootPEM, serverName: "istiod.istio-system.svc", wantErr: "certificate signed by unknown authority"},
		{name: "another name", roots: good.rootPEM, serverName: "evil.example.com", wantErr: "not evil.example.com"},
		{name: "default name is the address's host", roots: good.rootPEM, wantErr: "127.0.0.1"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := write("roots"+string(rune('a'+i))+".pem", tt.roots)
			err := check(t, Options{Address: addr, ServerName: tt.serverName, RootCertFile: file})
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Check error = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestDialRereadsChangedRoots(t *testing.T) {
	old := newTestCA(t, "istiod.istio-system.svc")
	rotated := newTestCA(t, "istiod.istio-system.svc")
	addr := serve(t, rotated.serving)
	file := filepath.Join(t.TempDir(), "root-cert.pem")
	if err := os.WriteFile(file, old.rootPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	roots, err := NewRoots(file, time.Nanosecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn := func() error {
		l, err := tls.Dial("tcp", addr, roots.ClientConfig("istiod.istio-system.svc"))
		if err != nil {
			return err
		}
		return l.Close()
	}
	if err := conn(); err == nil {
		t.Fatal("handshake with the old roots succeeded against a server of the rotated CA")
	}
	// A bad file keeps the last good roots; the rotated file is used.
	if err := os.WriteFile(file, []byte("not PEM, and longer than before"), 0o600); err != nil {
		t.Fatal(err)
	}
	if roots.Pool() == nil {
		t.Fatal("a bad file dropped the roots")
	}
	if err := os.WriteFile(file, append(old.rootPEM, rotated.rootPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := conn(); err != nil {
		t.Fatalf("handshake after the roots file gained the rotated root: %v", err)
	}
}

func TestDialOptionErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.pem")
	empty := filepath.Join(t.TempDir(), "empty.pem")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{name: "no address", opts: Options{RootCertFile: empty}, wantErr: "Address is required"},
		{name: "address without port", opts: Options{Address: "istiod", RootCertFile: empty}, wantErr: "missing port"},
		{name: "no roots", opts: Options{Address: "istiod:15012"}, wantErr: "RootCertFile is required"},
		{name: "missing roots", opts: Options{Address: "istiod:15012", RootCertFile: missing}, wantErr: "no such file"},
		{name: "empty roots", opts: Options{Address: "istiod:15012", RootCertFile: empty}, wantErr: "no PEM certificate"},
		{name: "connection window under HTTP/2's", opts: Options{Address: "istiod:15012", Plaintext: true, ConnWindowSize: 1024}, wantErr: "ConnWindowSize 1024"},
		{name: "stream window under HTTP/2's", opts: Options{Address: "istiod:15012", Plaintext: true, StreamWindowSize: -1}, wantErr: "StreamWindowSize -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := Dial(t.Context(), tt.opts)
			if err == nil {
				_ = conn.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Dial error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// The metrics report the connection's state and the expiry of the roots in
// use, updated when the roots file is rotated.
func TestMetricsFollowConnectionAndRoots(t *testing.T) {
	oldUntil, rotatedUntil := time.Now().Add(time.Hour).Truncate(time.Second), time.Now().Add(30*24*time.Hour).Truncate(time.Second)
	old := newTestCAUntil(t, "istiod.istio-system.svc", oldUntil)
	rotated := newTestCAUntil(t, "istiod.istio-system.svc", rotatedUntil)
	addr := serve(t, rotated.serving)
	file := filepath.Join(t.TempDir(), "root-cert.pem")
	if err := os.WriteFile(file, old.rootPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Address: addr, ServerName: "istiod.istio-system.svc", RootCertFile: file, RootRecheck: time.Nanosecond, Metrics: m}
	conn, err := Dial(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	gauge := func(name string, labels ...string) float64 {
		t.Helper()
		if len(labels) > 0 {
			return testutil.ToFloat64(m.state.WithLabelValues(labels...))
		}
		return testutil.ToFloat64(m.rootsExpiry)
	}
	waitState := func(state string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for gauge("state", state) != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("connection state %s not reported", state)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if got := gauge("expiry"); got != float64(oldUntil.Unix()) {
		t.Errorf("root expiry %v, want %v", got, oldUntil.Unix())
	}
	// Tried at once, before any call (a replica reaches istiod as it
	// starts): the old roots do not verify the rotated CA's server.
	waitState("transient_failure")
	health := healthpb.NewHealthClient(conn)
	if _, err := health.Check(t.Context(), &healthpb.HealthCheckRequest{}); err == nil {
		t.Fatal("the old roots verified the rotated CA's server")
	}
	waitState("transient_failure")
	if err := os.WriteFile(file, rotated.rootPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := health.Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("Check with the rotated roots: %v", err)
	}
	waitState("ready")
	if got := gauge("expiry"); got != float64(rotatedUntil.Unix()) {
		t.Errorf("root expiry after rotation %v, want %v", got, rotatedUntil.Unix())
	}
	if got := gauge("state", "transient_failure"); got != 0 {
		t.Errorf("transient_failure still %v once ready", got)
	}
	_ = conn.Close()
	waitState("shutdown")
}
