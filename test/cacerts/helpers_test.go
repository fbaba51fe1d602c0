package cacerts

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/embark-mesh/embark/test/meshkit"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
)

// authority is a CA certificate and its key.
type authority struct {
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	pem    []byte
	keyPEM []byte
}

// newAuthority creates a CA named cn, signed by parent, or self-signed (a
// root) when parent is nil.
func newAuthority(cn string, parent *authority) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key of %s: %w", cn, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, fmt.Errorf("serial of %s: %w", cn, err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn, Organization: []string{"embark test"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature}
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		return nil, fmt.Errorf("sign %s: %w", cn, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", cn, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal key of %s: %w", cn, err)
	}
	return &authority{cert: cert, key: key,
		pem:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// writeCACerts writes istiod's plugged-in CA files to dir, as the Secret
// cacerts holds them: inter signs (ca-cert.pem, ca-key.pem), its chain up
// to issuer (cert-chain.pem), and the roots trusted (root-cert.pem, the
// PEM of each of roots). root-cert.pem is written last, so that istiod,
// which reloads about 100 ms after the first change, sees a complete set.
func writeCACerts(dir string, inter, issuer *authority, roots ...*authority) error {
	if len(roots) == 0 {
		roots = []*authority{issuer}
	}
	var bundle []byte
	for _, r := range roots {
		bundle = append(bundle, r.pem...)
	}
	files := []struct {
		name string
		data []byte
	}{
		{"ca-key.pem", inter.keyPEM},
		{"ca-cert.pem", inter.pem},
		{"cert-chain.pem", append(bytes.Clone(inter.pem), issuer.pem...)},
		{"root-cert.pem", bundle},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", f.name, err)
		}
	}
	return nil
}

// parsePEM parses every certificate of data; an empty or truncated file is
// an error.
func parsePEM(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no certificate")
	}
	return out, nil
}

// verifyChain verifies chain[0] with the rest of chain as intermediates
// against the roots of bundle.
func verifyChain(chain, bundle []*x509.Certificate) error {
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range bundle {
		roots.AddCert(r)
	}
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

// holds reports whether bundle holds a's certificate.
func holds(bundle []*x509.Certificate, a *authority) bool {
	for _, c := range bundle {
		if c.Equal(a.cert) {
			return true
		}
	}
	return false
}

// workload is a registered VM.
type workload struct{ *meshkit.VM }

// register registers VM n of wg through the registry, as the onboarding
// endpoint does; its address is 10.0.1.n.
func register(t *testing.T, wg *istionetworkingv1.WorkloadGroup, n int) *workload {
	t.Helper()
	return &workload{meshkit.Register(t, env, wg, n, fmt.Sprintf("10.0.1.%d", n))}
}
