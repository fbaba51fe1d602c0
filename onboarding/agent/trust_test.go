package agent

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
	"testing"
	"time"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, cn string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf issues a serving certificate for host.
func (ca *testCA) leaf(t *testing.T, host string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// handshake runs a real TLS handshake of cfg over loopback against a
// server presenting cert and returns the client's error.
func handshake(t *testing.T, cfg *tls.Config, cert tls.Certificate) error {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		_ = c.(*tls.Conn).Handshake()
		_ = c.Close()
	}()
	// A bound on a handshake that went wrong, not a timing assertion.
	d := &net.Dialer{Timeout: 30 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", l.Addr().String(), cfg)
	if err == nil {
		_ = c.Close()
	}
	return err
}

// The endpoint is verified against caCertificates and the installed roots
// as they are at each handshake: a serving certificate of a new CA is
// trusted once either file holds that CA, and never for another name.
func TestEndpointTrustFollowsTheFiles(t *testing.T) {
	dir := t.TempDir()
	caFile, installed := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "embark-root-cert.pem")
	ca1, ca2, other := newTestCA(t, "serving CA one"), newTestCA(t, "serving CA two"), newTestCA(t, "someone else")
	write := func(path string, data []byte) {
		t.Helper()
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(caFile, ca1.pem)
	const host = "onboarding.example.corp"
	trust, err := newEndpointTrust(caFile, installed)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12, InsecureSkipVerify: true, VerifyConnection: trust.verify(host)} //nolint:gosec // VerifyConnection verifies
	l1, l2, lOther := ca1.leaf(t, host), ca2.leaf(t, host), other.leaf(t, host)
	steps := []struct {
		name    string
		before  func()
		cert    tls.Certificate
		trusted bool
	}{
		{"CA one's certificate, no roots installed yet", func() {}, l1, true},
		{"CA two's certificate before anyone publishes it", func() {}, l2, false},
		{"CA two installed from the endpoint with CA one", func() { write(installed, append(append([]byte{}, ca1.pem...), ca2.pem...)) }, l2, true},
		{"an installed file that breaks keeps its last good roots", func() { write(installed, []byte("truncated")) }, l2, true},
		{"a certificate of another CA", func() {}, lOther, false},
		{"CA two's certificate for another name", func() {}, ca2.leaf(t, "elsewhere.example.corp"), false},
		{"caCertificates updated to CA two alone", func() { write(caFile, ca2.pem); write(installed, ca2.pem) }, l2, true},
		{"CA one no longer trusted", func() {}, l1, false},
	}
	for _, st := range steps {
		st.before()
		if err := handshake(t, cfg, st.cert); (err == nil) != st.trusted {
			t.Errorf("%s: handshake error %v, want trusted %v", st.name, err, st.trusted)
		}
	}
	if _, err := newEndpointTrust(filepath.Join(dir, "missing.pem"), installed); err == nil {
		t.Error("a missing caCertificates file is accepted at start")
	}
}
