package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/types"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	"github.com/embark-mesh/embark/test/testenv"
)

// servingCert is the endpoint's demo TLS certificate and the CA that signed it.
type servingCert struct {
	certFile, keyFile string
	caFile            string // the CA's PEM, as the VMs trust it
	caPEM             []byte
	pool              *x509.CertPool
}

// writeServingCert writes a demo CA-signed serving certificate for host into
// dir.
func writeServingCert(dir, host string) (servingCert, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return servingCert{}, err
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Embark demo CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return servingCert{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return servingCert{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return servingCert{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return servingCert{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return servingCert{}, err
	}
	sc := servingCert{certFile: filepath.Join(dir, "tls.crt"), keyFile: filepath.Join(dir, "tls.key"), caFile: filepath.Join(dir, "demo-ca.pem"),
		caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), pool: x509.NewCertPool()}
	sc.pool.AddCert(ca)
	if err := os.WriteFile(sc.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return servingCert{}, err
	}
	if err := os.WriteFile(sc.caFile, sc.caPEM, 0o644); err != nil {
		return servingCert{}, err
	}
	if err := os.WriteFile(sc.keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return servingCert{}, err
	}
	return sc, nil
}

// checkCreated checks that the seeds are stored in namespace ns.
func checkCreated(ctx context.Context, env *testenv.Env, ns string) error {
	if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "ratings"}, &istionetworkingv1.WorkloadGroup{}); err != nil {
		return fmt.Errorf("WorkloadGroup ratings: %w", err)
	}
	policies := &authorizationv1alpha1.OnboardingPolicyList{}
	if err := env.Client.List(ctx, policies); err != nil {
		return err
	}
	if len(policies.Items) != 1 {
		return fmt.Errorf("%d OnboardingPolicies, want 1", len(policies.Items))
	}
	return nil
}

func keyOf(v *vm) types.NamespacedName {
	return types.NamespacedName{Namespace: "bookinfo", Name: v.reg()}
}

// mustAssets is where `make testenv` put istioctl (for the hint printed at
// the end; the demo itself found it there already).
func mustAssets() string {
	dir, err := testenv.AssetsDir("")
	if err != nil {
		return "bin/testenv"
	}
	return dir
}

// freePort returns a port free on 127.0.0.1 a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "127.0.0.1:0"
	}
	defer l.Close()
	return l.Addr().String()
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + "\n"
}
