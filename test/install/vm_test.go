//go:build install

package install

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/app"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/demo/check"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/testenv"
	"github.com/embark-mesh/embark/test/vmsim"
)

// The endpoint's DNS name, as the guide's first block names it.
const vmTestHost = "onboarding-endpoint.example.com"

// vmWorld is the VM side's own stand-in for the cluster side: a real
// kube-apiserver, the real endpoint (app.Run, on loopback, as
// onboarding/agent/integration runs it) serving its signed local repository
// with the onboarding-agent packages `make packages` built and the test's
// istio-sidecar package, and a forwarder per gateway port on the VM
// network's host address, standing in for the vmgateway Service. The
// instance's IMDS is awstest's, reachable in the VM at 169.254.169.254:80.
type vmWorld struct {
	env          *testenv.Env
	kube         kubernetes.Interface
	istiod       *testenv.Istiod
	net          *Network
	ca           *fixtures.CA
	endpointLog  *vmsim.SyncBuffer
	fingerprints []string
}

func newVMWorld(t *testing.T) *vmWorld {
	t.Helper()
	pkgDir, keyFile := os.Getenv("PACKAGES_DIR"), os.Getenv("PACKAGE_SIGNING_KEY")
	if pkgDir == "" || keyFile == "" {
		t.Fatal("PACKAGES_DIR and PACKAGE_SIGNING_KEY must be set (make packages: _output/packages and its signing key)")
	}
	ctrllog.SetLogger(logr.Discard())
	env, err := testenv.Start(testenv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	w := &vmWorld{env: env, endpointLog: &vmsim.SyncBuffer{}}
	w.kube, err = kubernetes.NewForConfig(env.Config)
	must(t, err)
	w.net = NewNetwork(t, "embark-vm", "10.201.0.1/30", "10.201.0.2/30", false)

	// The cluster side's objects, as docs/operator-guide.md has an operator
	// apply them: the bookinfo namespace, WorkloadGroup ratings and the
	// seed 004 policy allowing the account's EC2 instances.
	ctx := t.Context()
	must(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bookinfo"}}))
	fixtures.CreateGroup(ctx, t, env.Client, fixtures.SeedGroup("bookinfo"))
	policy := &authorizationv1alpha1.OnboardingPolicy{}
	data, err := os.ReadFile("../../api/crds/testdata/seed004/policy-any-ec2-in-accounts.yaml")
	must(t, err)
	must(t, yaml.UnmarshalStrict(data, policy))
	must(t, env.Client.Create(ctx, policy))
	issuer, issuerCA := w.onPremIssuer(t, filepath.Join(t.TempDir(), "issuer-ca.pem"))

	// The instance: its document's private IP is the VM's address.
	aws := awstest.Start(t, awstest.Instance{PrivateIP: w.net.PeerIP.String()})
	ServeIMDS(t, w.net, aws.IMDS.URL)

	dir := t.TempDir()
	w.ca, err = fixtures.NewCA("embark install test CA")
	must(t, err)
	serving, err := w.ca.Sign(vmTestHost)
	must(t, err)
	certFile, keyFileOut := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	must(t, writeTLS(serving, certFile, keyFileOut))
	// A real istiod; the endpoint verifies it with its root.
	w.istiod, err = testenv.StartIstiod(ctx, env, testenv.IstiodOptions{})
	must(t, err)
	t.Cleanup(func() { _ = w.istiod.Close() })
	rootFile := filepath.Join(dir, "root-cert.pem")
	must(t, os.WriteFile(rootFile, w.istiod.RootCert, 0o644))
	// The roots every bootstrap carries (mesh.rootCertFile): the serving
	// certificate's CA, which the sidecar verifies the discovery address with.
	servingCA := filepath.Join(dir, "ca.crt")
	must(t, w.ca.WritePEM(servingCA))
	awsCerts := filepath.Join(dir, "aws-certs")
	must(t, os.MkdirAll(awsCerts, 0o755))
	must(t, os.WriteFile(filepath.Join(awsCerts, "us-east-2.pem"), aws.CA.CertificatePEM(), 0o644))

	repo := filepath.Join(dir, "repository")
	for _, f := range []string{"deb/amd64/onboarding-agent.deb", "deb/arm64/onboarding-agent.deb", "rpm/amd64/onboarding-agent.rpm", "rpm/arm64/onboarding-agent.rpm"} {
		b, err := os.ReadFile(filepath.Join(pkgDir, f))
		must(t, err)
		must(t, os.MkdirAll(filepath.Dir(filepath.Join(repo, f)), 0o755))
		must(t, os.WriteFile(filepath.Join(repo, f), b, 0o644))
	}
	BuildIstioSidecarDeb(t, repo) // the operator's addition
	signingKey, err := filepath.Abs(keyFile)
	must(t, err)

	ports := map[string]string{"repository": "443", "onboarding": "15443", "xds": "15012"}
	addrs := map[string]string{"repository": freeLoopback(t), "onboarding": freeLoopback(t), "xds": freeLoopback(t)}
	cfg := fmt.Sprintf(`apiVersion: config.onboarding.tetrate.io/v1alpha1
kind: OnboardingEndpointConfiguration
namespace: %s
endpoint:
  hosts: [%s]
  certFile: %s
  keyFile: %s
mesh:
  discoveryAddress: %s:15012
  rootCertFile: %s
istiod:
  address: %s
  serverName: %s
  rootCertFile: %s
  relayXDS: true
identity:
  aws:
    certificatesDir: %s
    stsEndpoint: %s
  jwt:
  - issuer: %q
    shortName: kube
    subjectPrefix: "system:serviceaccount:bookinfo:"
    caFile: %s
    maxTokenLifetime: 15m
registration:
  gracePeriod: 1h
  propagationDelay: 1s
localRepository:
  directory: %s
  signingKeyFile: %s
listen:
  repository: %s
  onboarding: %s
  xds: %s
  metrics: %s
`, env.Namespace(t), vmTestHost, certFile, keyFileOut, vmTestHost, servingCA, w.istiod.SecureGRPCAddr, testenv.IstiodServerName, rootFile, awsCerts, aws.STS.URL, issuer, issuerCA, repo, signingKey,
		addrs["repository"], addrs["onboarding"], addrs["xds"], freeLoopback(t))
	cfgFile := filepath.Join(dir, "endpoint.yaml")
	must(t, os.WriteFile(cfgFile, []byte(cfg), 0o600))
	w.startEndpoint(t, cfgFile)

	// The gateway: each Service port on the VM network's host address.
	for name, port := range ports {
		l, err := w.net.listenHost(port)
		must(t, err)
		t.Cleanup(func() { _ = l.Close() })
		go relayTCP(l, addrs[name])
	}
	w.fingerprints = logFingerprints(w.endpointLog.String())
	if len(w.fingerprints) == 0 {
		t.Fatalf("the endpoint logged no repository key:\n%s", w.endpointLog.String())
	}
	return w
}

func (w *vmWorld) startEndpoint(t *testing.T, cfgFile string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- app.Run(ctx, app.Options{ConfigFile: cfgFile, Kubeconfig: w.env.KubeconfigPath, Replica: "install-vm-0", DebugXDS: "off",
			Logger: slog.New(slog.NewTextHandler(w.endpointLog, nil)), Ready: ready})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("endpoint did not stop")
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("endpoint: %v\n%s", err, w.endpointLog.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("endpoint not ready within 2m\n%s", w.endpointLog.String())
	}
}

// spiffeID is the identity istiod's CA gives the group's workloads.
func (w *vmWorld) spiffeID() string {
	return "spiffe://" + w.istiod.TrustDomain + "/ns/bookinfo/sa/" + fixtures.ServiceAccount
}

var keyLogLine = regexp.MustCompile(`local repository: apt and yum metadata signed" key=([0-9A-Fa-f]{40})`)

// logFingerprints reads the repository key fingerprints from the
// endpoint's log line the guide points an operator to.
func logFingerprints(log string) []string {
	var fps []string
	for _, m := range keyLogLine.FindAllStringSubmatch(log, -1) {
		fps = append(fps, m[1])
	}
	return fps
}

// TestVMFollowsTheGuide: a fresh VM (its own network namespace with no
// default route, an overlay of the host's root) runs docs/vm-install.md's
// blocks as written, filled in as the guide tells an operator to (the
// endpoint's CA installed as the guide says, EMBARK_KEYS from the endpoint's
// log line): apt-get installs istio-sidecar and onboarding-agent from the
// endpoint's signed repository through the gateway, systemctl starts the
// agent, which onboards with its EC2 identity (IMDS at 169.254.169.254 in
// the VM), and the .path unit installs the bootstrap where Istio's package
// reads it and starts istio.service.
func TestVMFollowsTheGuide(t *testing.T) {
	w := newVMWorld(t)
	vm := StartVM(t, w.net, map[string]netip.Addr{vmTestHost: w.net.HostIP})
	ctx := t.Context()
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := vm.Run(context.WithoutCancel(ctx), "journalctl; tail -n 40 /var/log/istio/istio.log /var/log/istio/istio.err.log || true", nil)
			t.Logf("the VM's journal (stand-in) and Istio's log:\n%s\nendpoint log:\n%s", out, w.endpointLog.String())
		}
	})

	t.Log("the VM reaches the gateway only: the host's loopback listeners are not reachable")
	u, err := url.Parse(w.env.Config.Host)
	must(t, err)
	for name, addr := range map[string]string{"kube-apiserver": u.Host, "istiod (xDS and CA)": w.istiod.SecureGRPCAddr, "istiod (plaintext)": w.istiod.GRPCAddr} {
		_, port, err := net.SplitHostPort(addr)
		must(t, err)
		for _, a := range []string{addr, net.JoinHostPort(w.net.HostIP.String(), port)} {
			if err := vm.Connect(ctx, a); err == nil {
				t.Errorf("the VM connected to the host's %s at %s", name, a)
			}
		}
	}
	if err := vm.Connect(ctx, net.JoinHostPort(w.net.HostIP.String(), "443")); err != nil {
		t.Fatalf("the VM cannot reach the gateway: %v", err)
	}

	t.Log("the guide's blocks, with the CA and keys an operator has")
	FollowGuide(t, vm, vmTestHost, w.ca.PEM, w.fingerprints)
	for _, pkg := range []string{"onboarding-agent", "istio-sidecar"} {
		if got, err := vm.Run(ctx, "dpkg-query -W -f '${Status}' "+pkg, nil); err != nil || got != "install ok installed" {
			t.Errorf("%s: %q %v", pkg, got, err)
		}
	}

	regs := func() []runtimev1alpha1.WorkloadAutoRegistration {
		l := &runtimev1alpha1.WorkloadAutoRegistrationList{}
		must(t, w.env.Client.List(ctx, l, client.InNamespace("bookinfo")))
		return l.Items
	}

	t.Log("onboarded: one registration with the VM's EC2 address")
	var reg runtimev1alpha1.WorkloadAutoRegistration
	fixtures.Eventually(t, 30*time.Second, "a WorkloadAutoRegistration", func() bool {
		if r := regs(); len(r) == 1 {
			reg = r[0]
			return true
		}
		return false
	})
	if a := reg.Spec.Registration.Host.Addresses; len(a) == 0 || a[0].IP != w.net.PeerIP.String() {
		t.Errorf("registered addresses %+v, want %s", a, w.net.PeerIP)
	}

	t.Log("onboarding-agent-sidecar.path: the bootstrap installed where istio.service reads it, istio.service started")
	fixtures.Eventually(t, 60*time.Second, "cluster.env installed", func() bool {
		s, err := vm.ReadFile("/var/lib/istio/envoy/cluster.env")
		return err == nil && strings.Contains(s, "POD_NAME='"+reg.Name+"'")
	})
	for _, f := range []string{"/etc/istio/config/mesh", "/etc/certs/embark-root-cert.pem"} {
		if _, err := vm.ReadFile(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	fixtures.Eventually(t, 30*time.Second, "istio.service active", func() bool {
		_, err := vm.Run(ctx, "systemctl is-active --quiet istio", nil)
		return err == nil
	})
	if out, err := vm.Run(ctx, "systemctl status onboarding-agent istio --no-pager", nil); err != nil {
		t.Errorf("the guide's check: systemctl status: %v\n%s", err, out)
	}

	t.Log("the sidecar: a workload certificate from istiod's CA, AgentConnected=True, SYNCED in istioctl proxy-status")
	vm.StartEnvoyStandIn(t)
	checkWorkloadCertificate(t, vm, w.istiod.RootCert, w.spiffeID())
	fixtures.Eventually(t, 60*time.Second, "AgentConnected=True", func() bool {
		r := &runtimev1alpha1.WorkloadAutoRegistration{}
		if w.env.Client.Get(ctx, client.ObjectKey{Namespace: "bookinfo", Name: reg.Name}, r) != nil {
			return false
		}
		return meta.IsStatusConditionTrue(r.Status.Conditions, runtimev1alpha1.ConditionAgentConnected)
	})
	// RDS stays IGNORED here: this world has no Service, so no listener
	// with routes (the cluster side's operator-guide objects have some).
	checkProxyStatus(t, w.istiod.GRPCAddr, map[string]string{reg.Name + ".bookinfo": "istiod-local"}, "CDS", "LDS", "EDS") // testenv istiod's POD_NAME
}

// checkWorkloadCertificate waits for the certificate pilot-agent writes in
// vm (OUTPUT_CERTS: /etc/certs, istio-start.sh's default) and checks it
// chains to istiodRoot and names the SPIFFE ID want.
func checkWorkloadCertificate(t *testing.T, vm *VM, istiodRoot []byte, want string) {
	t.Helper()
	var chain string
	fixtures.Eventually(t, 60*time.Second, "the workload certificate in /etc/certs/cert-chain.pem", func() bool {
		s, err := vm.ReadFile("/etc/certs/cert-chain.pem")
		chain = s
		return err == nil && strings.Contains(s, "BEGIN CERTIFICATE")
	})
	block, rest := pem.Decode([]byte(chain))
	leaf, err := x509.ParseCertificate(block.Bytes)
	must(t, err)
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	roots.AppendCertsFromPEM(istiodRoot)
	inter.AppendCertsFromPEM(rest)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("the workload certificate does not chain to istiod's root: %v", err)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
		t.Errorf("the workload certificate names %v, want %s", leaf.URIs, want)
	}
}

// checkProxyStatus waits until `istioctl proxy-status` against istiod's
// plaintext xDS address lists want (proxy -> istiod column) with each of
// types SYNCED.
func checkProxyStatus(t *testing.T, istiodAddr string, want map[string]string, types ...string) {
	t.Helper()
	var last string
	err := fixtures.Poll(t.Context(), time.Second, 60*time.Second, func() error {
		out, err := istioagent.Istioctl(t.Context(), t, "proxy-status", "--xds-address", istiodAddr, "--plaintext", "-r", "default", "-v", "1")
		if err != nil {
			return err
		}
		last = out
		if err := check.ProxyStatus(out, want); err != nil {
			return err
		}
		return check.Synced(out, len(want), types...)
	})
	if err != nil {
		t.Errorf("istioctl proxy-status: %v\n%s", err, last)
	}
}
