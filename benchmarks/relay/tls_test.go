package relay

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"

	"github.com/embark-mesh/embark/test/testenv"
)

// istiodChain is the certificate chain istiod presents on its secure gRPC
// port, its serving certificate first.
func istiodChain(i *testenv.Istiod) ([]*x509.Certificate, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", i.SecureGRPCAddr,
		&tls.Config{RootCAs: i.RootPool(), ServerName: testenv.IstiodServerName, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}})
	if err != nil {
		return nil, fmt.Errorf("TLS to istiod: %w", err)
	}
	defer func() { _ = c.Close() }()
	return c.ConnectionState().PeerCertificates, nil
}

// servingTLS returns a server TLS configuration for Embark's xDS listener in
// the benchmark and the PEM root that verifies it: a self-signed root and a
// serving certificate for Embark's name whose key is of the same kind and
// size as istiod's serving key (RSA of the same size, or ECDSA on the same
// curve), so that both client-facing sides do the same TLS work and hold the
// same TLS state per connection; the chain sent has as many certificates as
// istiod's.
func servingTLS(like []*x509.Certificate) (*tls.Config, []byte, error) {
	newKey := func() (crypto.Signer, error) {
		switch pub := like[0].PublicKey.(type) {
		case *rsa.PublicKey:
			return rsa.GenerateKey(rand.Reader, pub.N.BitLen())
		case *ecdsa.PublicKey:
			return ecdsa.GenerateKey(pub.Curve, rand.Reader)
		default:
			return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		}
	}
	caKey, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "embark benchmark root"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, err
	}
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: embarkServerName},
		DNSNames:  []string{embarkServerName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, err
	}
	chain := [][]byte{der}
	if len(like) > 1 {
		chain = append(chain, caDER)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{{Certificate: chain, PrivateKey: key}},
		MinVersion:   tls.VersionTLS12,
	}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), nil
}

// embarkServerName is the name in Embark's serving certificate here.
const embarkServerName = "embark.embark-system.svc"
