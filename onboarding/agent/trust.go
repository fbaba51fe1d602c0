package agent

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
)

// endpointTrust is the set of roots the onboarding endpoint's serving
// certificate is verified against, read again at each TLS handshake:
// onboardingEndpoint.caCertificates as the file is now, and the roots the
// agent installed from the endpoint (the bootstrap's root certificates,
// sent again with each sidecar token renewal). A running VM thus follows a
// rotation of the endpoint's serving CA published with overlap (old and new
// CA together in the endpoint's roots) on its next connection, without a
// restart. A file that cannot be read keeps its last good certificates.
type endpointTrust struct {
	caFile, installedFile string

	mu       sync.Mutex
	lastGood map[string][]byte
}

// newEndpointTrust reads caFile once (an unreadable or empty file is an
// error, as at start before) and returns the trust.
func newEndpointTrust(caFile, installedFile string) (*endpointTrust, error) {
	t := &endpointTrust{caFile: caFile, installedFile: installedFile, lastGood: map[string][]byte{}}
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read onboardingEndpoint.caCertificates: %w", err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("onboardingEndpoint.caCertificates %s: no PEM certificate", caFile)
	}
	t.lastGood[caFile] = data
	return t, nil
}

// pool returns the roots as the files are now.
func (t *endpointTrust) pool() *x509.CertPool {
	t.mu.Lock()
	defer t.mu.Unlock()
	pool := x509.NewCertPool()
	for _, f := range []string{t.caFile, t.installedFile} {
		if f == "" {
			continue
		}
		if data, err := os.ReadFile(f); err == nil && x509.NewCertPool().AppendCertsFromPEM(data) {
			t.lastGood[f] = data
		}
		pool.AppendCertsFromPEM(t.lastGood[f])
	}
	return pool
}

// verify is tls.Config.VerifyConnection: the chain the server presents,
// for serverName, against pool().
func (t *endpointTrust) verify(serverName string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the onboarding endpoint presented no certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{DNSName: serverName, Roots: t.pool(), Intermediates: inter,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		if err != nil {
			return fmt.Errorf("verify the onboarding endpoint's certificate: %w", err)
		}
		return nil
	}
}
