package istioagent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// writeWorkloadCerts writes a self-signed root and a workload certificate for
// spiffe://cluster.local/ns/<namespace>/sa/<serviceAccount> as the file-mounted
// certificates pilot-agent reads with FILE_MOUNTED_CERTS=true: key.pem,
// cert-chain.pem and root-cert.pem in dir. They only keep pilot-agent from
// asking a CA; nothing verifies them.
func writeWorkloadCerts(dir, namespace, serviceAccount string) error {
	now := time.Now()
	rootKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate root key: %w", err)
	}
	root := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{Organization: []string{"cluster.local"}, CommonName: "istioagent test root"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	rootDER, err := x509.CreateCertificate(rand.Reader, root, root, &rootKey.PublicKey, rootKey)
	if err != nil {
		return fmt.Errorf("create root certificate: %w", err)
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate workload key: %w", err)
	}
	id := &url.URL{Scheme: "spiffe", Host: "cluster.local", Path: "/ns/" + namespace + "/sa/" + serviceAccount}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{id},
	}
	rootCert, err := x509.ParseCertificate(rootDER)
	if err != nil {
		return fmt.Errorf("parse root certificate: %w", err)
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, rootCert, &key.PublicKey, rootKey)
	if err != nil {
		return fmt.Errorf("create workload certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode workload key: %w", err)
	}

	files := []struct {
		name, typ string
		der       []byte
		perm      os.FileMode
	}{
		{"root-cert.pem", "CERTIFICATE", rootDER, 0o644},
		{"cert-chain.pem", "CERTIFICATE", leafDER, 0o644},
		{"key.pem", "PRIVATE KEY", keyDER, 0o600},
	}
	for _, f := range files {
		data := pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der})
		if err := writeFile(filepath.Join(dir, f.name), data, f.perm); err != nil {
			return err
		}
	}
	return nil
}
