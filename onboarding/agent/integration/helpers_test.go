package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	endpointconfig "github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/endpointkit"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/freeport"
	"github.com/embark-mesh/embark/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	testenv.Main(m, testenv.Options{GarbageCollector: true}, &env)
}

const endpointHost = "onboarding-endpoint.agent.test"

// world is one namespace with a WorkloadGroup, an AWS region with one
// instance, and the endpoint's configuration (TLS, loopback ports).
type world struct {
	t        *testing.T
	ns       string
	dir      string
	aws      *awstest.Env
	caFile   string
	cfg      *endpointconfig.Configuration
	addr     string
	repoDir  string
	repoAddr string
	endpoint *endpointkit.Endpoint
}

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{t: t, ns: env.Namespace(t), dir: t.TempDir()}
	w.aws = awstest.Start(t, awstest.Instance{Role: "ratings-role", PrivateIP: "172.31.5.254"})
	certs := filepath.Join(w.dir, "aws-certs")
	must(t, os.MkdirAll(certs, 0o755))
	must(t, os.WriteFile(filepath.Join(certs, "us-east-2.pem"), w.aws.CA.CertificatePEM(), 0o644))
	certFile, keyFile, caFile := writeServingCert(t, w.dir)
	w.caFile = caFile
	w.addr, w.repoAddr = freeAddr(t), freeAddr(t)
	w.repoDir = filepath.Join(w.dir, "repository")
	must(t, os.MkdirAll(w.repoDir, 0o755))
	w.cfg = configkit.Serving(configkit.Config(w.ns), certFile, keyFile)
	w.cfg.Endpoint.Hosts = []string{endpointHost}
	w.cfg.TokenIssuer.JWT.Expiration = configkit.Duration(time.Minute)
	w.cfg.Identity.AWS = endpointconfig.AWSIdentity{CertificatesDir: certs, STSEndpoint: w.aws.STS.URL,
		InstanceProfileCheck: &endpointconfig.InstanceProfileCheck{EC2Endpoint: w.aws.EC2IAM.URL, IAMEndpoint: w.aws.EC2IAM.URL}}
	w.cfg.Registration.GracePeriod = configkit.Duration(time.Hour)
	w.cfg.Registration.PropagationDelay = configkit.Duration(time.Second)
	w.cfg.LocalRepository = &endpointconfig.LocalRepository{Directory: w.repoDir}
	// Fixed addresses: a restarted endpoint serves where the agent was
	// configured to reach it.
	w.cfg.Listen = endpointconfig.Listen{Repository: w.repoAddr, Onboarding: w.addr, Metrics: freeAddr(t), XDS: freeAddr(t)}
	// The endpoint's own AWS credentials (the SDK's default chain, for the
	// instance profile check): the pair the EC2/IAM fake accepts.
	t.Setenv("AWS_ACCESS_KEY_ID", w.aws.EC2IAM.AccessKeyID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", w.aws.EC2IAM.SecretAccessKey)
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)

	wg := fixtures.SeedGroup(w.ns)
	wg.Spec.Template.Labels["version"] = "v1"
	// The agent reports host=vm-1: the group lets its workloads set host.
	wg.Annotations = map[string]string{registry.AnnotationAgentLabels: "host"}
	fixtures.CreateGroup(t.Context(), t, env.Client, wg)
	t.Cleanup(w.stopEndpoint)
	return w
}

// startEndpoint runs the endpoint binary's app.Run with w.cfg until
// stopEndpoint.
func (w *world) startEndpoint() {
	w.t.Helper()
	w.endpoint = endpointkit.Start(w.t, endpointkit.Options{Config: w.cfg, Kubeconfig: env.KubeconfigPath, Replica: "agent-test-0", Dir: w.dir})
}

func (w *world) stopEndpoint() {
	if w.endpoint == nil {
		return
	}
	w.endpoint.Stop()
	w.endpoint = nil
}

// allow applies the example policy allowing the instance's account.
func (w *world) allow() {
	w.t.Helper()
	data, err := os.ReadFile("../../../api/crds/testdata/seed004/policy-any-ec2-in-accounts.yaml")
	must(w.t, err)
	p := &authorizationv1alpha1.OnboardingPolicy{}
	must(w.t, yaml.UnmarshalStrict(data, p))
	p.Namespace = w.ns
	must(w.t, env.Client.Create(w.t.Context(), p))
}

// registrations lists the namespace's WorkloadAutoRegistrations.
func (w *world) registrations() []runtimev1alpha1.WorkloadAutoRegistration {
	w.t.Helper()
	list := &runtimev1alpha1.WorkloadAutoRegistrationList{}
	must(w.t, env.Client.List(w.t.Context(), list, client.InNamespace(w.ns)))
	return list.Items
}

func countLines(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "\n")
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	return string(b)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	return freeport.MustAddr(t)
}

// writeServingCert writes a test CA and a serving certificate for
// endpointHost signed by it.
func writeServingCert(t *testing.T, dir string) (certFile, keyFile, caFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "agent test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	must(t, err)
	ca, err := x509.ParseCertificate(caDER)
	must(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: endpointHost}, DNSNames: []string{endpointHost},
		IPAddresses: []net.IP{net.IPv6loopback, net.IPv4(127, 0, 0, 1)}, // apt and dnf, which cannot be told a host's address
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	must(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	must(t, err)
	certFile, keyFile, caFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	must(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644))
	must(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	must(t, os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644))
	return certFile, keyFile, caFile
}
