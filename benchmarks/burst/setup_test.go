package burst

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/endpointkit"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/testenv"
)

// deployment is one run's control plane beside the API server: a real
// istiod and the onboarding endpoint (app.Run, in this process) in istiod
// mode, its xDS listener (ADS relay and CA relay) serving TLS.
type deployment struct {
	istiod *testenv.Istiod
	ep     *endpointkit.Endpoint
	// roots verify the endpoint's serving certificate.
	roots *x509.CertPool
	ns    string
}

// istiodEnv raises istiod's admission of new ADS streams (25 a second by
// default, PILOT_MAX_REQUESTS_PER_SECOND; a stream waiting over 1 s fails
// with ResourceExhausted): a burst opens hundreds at once, relayed or not.
var istiodEnv = []string{"PILOT_MAX_REQUESTS_PER_SECOND=100000"}

// maxConnections is the endpoint's default connection limit per server;
// one source (this process) may hold all of them.
const maxConnections = 10000

// startDeployment starts istiod and the endpoint for namespace ns; the
// endpoint trusts ca for EC2 identity documents. Every simulated VM
// connects from 127.0.0.1, so the per-source limits (sized for one host
// each) are raised as the fault suite raises them; every other setting is
// the endpoint's default (the write budget, the CA relay's rate).
func startDeployment(b *testing.B, ns string, ca *awstest.CA) *deployment {
	b.Helper()
	i, err := testenv.StartIstiod(b.Context(), cluster.Env, testenv.IstiodOptions{Env: istiodEnv})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = i.Close() })
	dir := b.TempDir()
	istiodRoots := filepath.Join(dir, "istiod-root-cert.pem")
	if err := os.WriteFile(istiodRoots, i.RootCert, 0o600); err != nil {
		b.Fatal(err)
	}
	certFile, keyFile, roots, err := servingCert(dir)
	if err != nil {
		b.Fatal(err)
	}
	awsCerts := filepath.Join(dir, "aws-certs")
	if err := os.MkdirAll(awsCerts, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(awsCerts, "us-east-2.pem"), ca.CertificatePEM(), 0o600); err != nil {
		b.Fatal(err)
	}
	cfg := configkit.Serving(configkit.Config(ns), certFile, keyFile)
	cfg.Identity.AWS.CertificatesDir = awsCerts
	cfg.Registration.GracePeriod = configkit.Duration(time.Hour)
	cfg.Registration.VerifyPerSecond = -1
	cfg.Istiod = config.Istiod{Address: i.SecureGRPCAddr, ServerName: testenv.IstiodServerName, RootCertFile: istiodRoots}
	cfg.Limits.Onboarding.RequestsPerSecondPerSource = 1e6
	cfg.Limits.Onboarding.RequestBurstPerSource = 1e6
	cfg.Limits.XDS.RequestsPerSecondPerSource = 1e6
	cfg.Limits.XDS.RequestBurstPerSource = 1e6
	cfg.Limits.Onboarding.MaxConnectionsPerSource = maxConnections
	if *caBudget > 0 {
		cfg.Istiod.CertificateRelay = &config.CertificateRelay{RequestsPerSecond: *caBudget, Burst: int(*caBudget), MaxInFlight: 256}
	}
	cfg.Limits.XDS.MaxConnectionsPerSource = maxConnections
	ep := endpointkit.Start(b, endpointkit.Options{Config: cfg, Kubeconfig: cluster.Env.KubeconfigPath, Replica: "replica-" + ns, Dir: dir})
	return &deployment{istiod: i, ep: ep, roots: roots, ns: ns}
}

// tlsConfig is how a VM verifies the endpoint's xDS listener.
func (d *deployment) tlsConfig() *tls.Config {
	return &tls.Config{RootCAs: d.roots, MinVersion: tls.VersionTLS12}
}

// istiodTLS is how a client verifies istiod's secure port.
func (d *deployment) istiodTLS() *tls.Config {
	return &tls.Config{RootCAs: d.istiod.RootPool(), ServerName: testenv.IstiodServerName, MinVersion: tls.VersionTLS12}
}

// services creates the four Services istiod configures every VM with (the
// Bookinfo ports), so that CDS and LDS carry a configuration.
func services(b *testing.B, ns string) {
	b.Helper()
	for _, name := range []string{"ratings", "reviews", "details", "productpage"} {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name},
				Ports: []corev1.ServicePort{{Name: "http", Port: 9080, TargetPort: intstr.FromInt32(9080)}}},
		}
		if err := cluster.Env.Client.Create(b.Context(), svc); err != nil {
			b.Fatal(err)
		}
	}
}

// servingCert writes an ECDSA P-256 CA and a serving certificate for
// 127.0.0.1 signed by it (istiod's own chain is of the same length) to dir,
// and returns the files and a pool of the CA.
func servingCert(dir string) (certFile, keyFile string, roots *x509.CertPool, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "burst benchmark root"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return "", "", nil, fmt.Errorf("create CA: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return "", "", nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "onboarding-endpoint"},
		DNSNames: []string{configkit.Host}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return "", "", nil, fmt.Errorf("create serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", nil, err
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return "", "", nil, err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", nil, err
	}
	roots = x509.NewCertPool()
	roots.AddCert(caCert)
	return certFile, keyFile, roots, nil
}

// csrs returns n PEM certificate requests, each with a fresh ECDSA P-256
// key, made before anything is timed (a VM makes its key on its own host).
func csrs(n int) ([]string, error) {
	out := make([]string, n)
	for i := range out {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "vm"}}, key)
		if err != nil {
			return nil, fmt.Errorf("certificate request: %w", err)
		}
		out[i] = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	}
	return out, nil
}

// cluster is the control plane every benchmark of the package shares.
var cluster struct {
	Env *testenv.Env
}
