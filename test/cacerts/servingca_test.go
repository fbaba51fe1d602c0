package cacerts

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	meshconfig "istio.io/api/mesh/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	endpointconfig "github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/onboarding/agent"
	agentconfig "github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/agent/platform"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/endpointkit"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/freeport"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/meshkit"
	"github.com/embark-mesh/embark/test/testenv"
	"github.com/embark-mesh/embark/test/vmsim"
)

// servingHost is the onboarding endpoint's name in its serving certificate
// (the agent's TLS server name); the certificate also names 127.0.0.1, the
// discovery address pilot-agent dials.
const servingHost = "onboarding-endpoint.rotation.test"

// Embark's own serving CA is rotated under a VM onboarded by the real
// onboarding agent, whose real pilot-agent is relayed through Embark to
// the real istiod: the serving certificate is renewed under the same CA,
// then the new CA is published beside the old one (mesh.rootCertFile: the
// roots sent to VMs), the serving certificate is switched to the new CA,
// and the old CA is withdrawn. The agent installs the roots that come with
// each sidecar token renewal; pilot-agent watches that file (XDS_ROOT_CA,
// also CA_ROOT_CA) and dials with it from its next connection on. After
// each switch the endpoint is restarted so that pilot-agent and the agent
// connect again. Every 200 ms the certificate the endpoint serves is
// verified against the roots installed on the VM: never distrusted. The
// VM keeps its registration (same UID, no second onboarding), reconnects
// after each restart and renews its workload certificate through the new
// CA. Both ways the endpoint takes its certificate are run: files
// (certFile/keyFile, reloaded) and a TLS Secret updated as cert-manager
// does.
func TestServingCARotation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		secret bool
	}{{name: "files"}, {name: "secret", secret: true}} {
		t.Run(tc.name, func(t *testing.T) { rotateServingCA(t, tc.secret) })
	}
}

func rotateServingCA(t *testing.T, fromSecret bool) {
	ns := env.Namespace(t)
	dir := t.TempDir()
	w := newServingWorld(t, ns, dir, fromSecret)
	ca1 := mustAuthority(t, "embark serving CA one", nil)
	ca2 := mustAuthority(t, "embark serving CA two", nil)
	first := w.issue(t, ca1)
	w.serve(t, first)
	w.publish(t, ca1)
	w.start(t)

	vm := w.onboard(t)
	pa := istioagent.Start(t, istioagent.Options{
		DiscoveryAddress: w.cfg.Listen.XDS, PodName: vm.Key.Name, PodNamespace: ns, InstanceIP: vm.IP, ServiceAccount: fixtures.ServiceAccount,
		ProxyConfig: &meshconfig.ProxyConfig{ControlPlaneAuthPolicy: meshconfig.AuthenticationPolicy_MUTUAL_TLS},
		WorkDir:     w.root, EnvoyStandIn: true,
		// The files the onboarding agent wrote: its roots for Embark's
		// address (and CA) and the sidecar token it renews.
		Env: map[string]string{"XDS_ROOT_CA": w.rootsFile(), "CA_ROOT_CA": w.rootsFile(), "SECRET_TTL": shortTTL.String()},
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("onboarding agent log:\n%s\npilot-agent log:\n%s", meshkit.Tail(w.logs.String()), meshkit.Tail(grepLog(pa.Logs(), "CSR", "cert", "ca", "upstream", "rror", "arn")))
		}
	})
	node, err := pa.Node()
	if err != nil {
		t.Fatal(err)
	}
	workload := watchSDSAsEnvoy(t, pa, node, "default")
	ads := holdADS(t, pa)
	ads.waitLDSAfter(t, pa, time.Time{}, "first connection")
	before := waitAgentConnected(t, vm.Key)
	stop := w.sample(t)

	steps := []struct {
		name    string
		do      func()
		done    func(s servingState) bool
		restart bool
	}{{
		name: "serving certificate renewed under the same CA",
		do:   func() { w.serve(t, w.issue(t, ca1)) },
		done: func(s servingState) bool {
			return s.issuer == ca1.cert.Subject.CommonName && s.serial.Cmp(first.serial) != 0
		},
	}, {
		name: "the new CA published beside the old one",
		do:   func() { w.publish(t, ca1, ca2) },
		done: func(s servingState) bool {
			return s.installed[ca1.cert.Subject.CommonName] && s.installed[ca2.cert.Subject.CommonName]
		},
	}, {
		name:    "serving certificate issued by the new CA",
		do:      func() { w.serve(t, w.issue(t, ca2)) },
		done:    func(s servingState) bool { return s.issuer == ca2.cert.Subject.CommonName },
		restart: true,
	}, {
		name: "the old CA withdrawn",
		do:   func() { w.publish(t, ca2) },
		done: func(s servingState) bool {
			return !s.installed[ca1.cert.Subject.CommonName] && s.installed[ca2.cert.Subject.CommonName]
		},
		restart: true,
	}}
	for _, st := range steps {
		start := time.Now()
		st.do()
		w.waitFor(t, st.name, st.done)
		t.Logf("%s: reached by the VM %s after the change", st.name, time.Since(start).Round(100*time.Millisecond))
		if !st.restart {
			continue
		}
		restarted := time.Now()
		w.restart(t)
		ads.waitLDSAfter(t, pa, restarted, st.name+": after the endpoint restarted")
		renewedFrom := workload.serial()
		fixtures.Eventually(t, 3*shortTTL, st.name+": a workload certificate renewed through the restarted endpoint", func() bool {
			s := workload.serial()
			return s != nil && renewedFrom != nil && s.Cmp(renewedFrom) != 0
		})
	}
	stats := stop()
	t.Logf("%d samples of the served certificate against the VM's installed roots (%d while the endpoint was down)", stats.samples, stats.unreadable)
	if stats.samples < 10 {
		t.Errorf("only %d samples during the rotation", stats.samples)
	}
	for i, v := range stats.violations {
		if i == 5 {
			t.Errorf("... and %d more", len(stats.violations)-5)
			break
		}
		t.Errorf("the VM did not trust the endpoint at %s: %s", v.at.Format(time.StampMilli), v.what)
	}

	// pilot-agent's CA client reads CA_ROOT_CA at start and again only
	// after a failed request: its first request on a new connection after
	// the switch to the new CA fails once, the client reconnects with the
	// installed roots and closes the SDS stream, and Envoy's reopened
	// stream gets the certificate at once.
	failedCSR := strings.Count(pa.Logs(), "failed to sign CSR")
	t.Logf("pilot-agent: %d failed certificate requests (%d of them not verifying the endpoint), SDS stream reopened %d times",
		failedCSR, strings.Count(grepLog(pa.Logs(), "failed to sign CSR"), "unknown authority"), workload.reopened())
	if failedCSR > 2 {
		t.Errorf("%d failed certificate requests, want at most one per restart after the switch", failedCSR)
	}
	t.Logf("the ADS stream through pilot-agent was opened %d times (once, then once after each of the 2 restarts)", ads.opened())
	if n := ads.opened(); n != 3 {
		t.Errorf("the ADS stream was opened %d times, want 3: once, then once after each restart", n)
	}
	after := waitAgentConnected(t, vm.Key)
	if after.uid != before.uid {
		t.Errorf("the registration was re-created during the rotation: UID %s, then %s", before.uid, after.uid)
	}
	if n := countLines(filepath.Join(w.root, "restarts")); n != 1 {
		t.Errorf("the agent onboarded again: %d sidecar restarts, want 1", n)
	}
	for _, bad := range []string{"x509", "unknown authority", "handshake"} {
		if l := grepLog(strings.ReplaceAll(pa.Logs(), "failed to sign CSR", ""), bad); strings.Contains(l, "xdsproxy") {
			t.Errorf("pilot-agent's xDS proxy logged %q:\n%s", bad, l)
		}
		if l := grepLog(w.logs.String(), bad); l != "" {
			t.Errorf("the onboarding agent logged %q:\n%s", bad, l)
		}
	}
}

// servingWorld is one namespace's endpoint (istiod mode, the test istiod),
// its serving certificate and published roots, and the VM's onboarding
// agent writing under root.
type servingWorld struct {
	ns, dir, root string
	fromSecret    bool
	aws           *awstest.Env
	cfg           *endpointconfig.Configuration
	ep            *endpointkit.Endpoint
	publishedFile string // mesh.rootCertFile
	agentCAFile   string // the agent's onboardingEndpoint.caCertificates
	logs          *vmsim.SyncBuffer
	serial        int64
}

func newServingWorld(t *testing.T, ns, dir string, fromSecret bool) *servingWorld {
	t.Helper()
	w := &servingWorld{ns: ns, dir: dir, root: filepath.Join(dir, "vm"), fromSecret: fromSecret, logs: &vmsim.SyncBuffer{},
		publishedFile: filepath.Join(dir, "published-roots.pem"), agentCAFile: filepath.Join(dir, "agent-ca.pem")}
	w.aws = awstest.Start(t, awstest.Instance{Role: "ratings-role", PrivateIP: "172.31.5.254"})
	certs := filepath.Join(dir, "aws-certs")
	must(t, os.MkdirAll(certs, 0o755))
	must(t, os.WriteFile(filepath.Join(certs, "us-east-2.pem"), w.aws.CA.CertificatePEM(), 0o644))
	// istiod's roots as they are now (what the kubelet mounts of the
	// ConfigMap).
	var cm corev1.ConfigMap
	must(t, env.Client.Get(t.Context(), types.NamespacedName{Namespace: testenv.IstiodNamespace, Name: "istio-ca-root-cert"}, &cm))
	istiodRoots := filepath.Join(dir, "istiod-root-cert.pem")
	must(t, os.WriteFile(istiodRoots, []byte(cm.Data["root-cert.pem"]), 0o600))

	w.cfg = configkit.Config(ns)
	w.cfg.Endpoint.Plaintext = false
	if fromSecret {
		w.cfg.Endpoint.SecretName = "embark-serving"
	} else {
		w.cfg.Endpoint.CertFile, w.cfg.Endpoint.KeyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	}
	w.cfg.Endpoint.Hosts = []string{servingHost}
	w.cfg.Identity.AWS = endpointconfig.AWSIdentity{CertificatesDir: certs, STSEndpoint: w.aws.STS.URL,
		InstanceProfileCheck: &endpointconfig.InstanceProfileCheck{EC2Endpoint: w.aws.EC2IAM.URL, IAMEndpoint: w.aws.EC2IAM.URL}}
	w.cfg.Registration.GracePeriod = configkit.Duration(time.Hour)
	w.cfg.Istiod = endpointconfig.Istiod{Address: istiod.SecureGRPCAddr, ServerName: testenv.IstiodServerName, RootCertFile: istiodRoots}
	w.cfg.Mesh.RootCertFile = w.publishedFile
	// Fixed addresses: the restarted endpoint serves where the VM connects.
	w.cfg.Listen = endpointconfig.Listen{Onboarding: freeport.MustAddr(t), Metrics: freeport.MustAddr(t), XDS: freeport.MustAddr(t), Repository: freeport.MustAddr(t)}
	t.Setenv("AWS_ACCESS_KEY_ID", w.aws.EC2IAM.AccessKeyID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", w.aws.EC2IAM.SecretAccessKey)
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)

	wg := fixtures.SeedGroup(ns)
	fixtures.CreateGroup(t.Context(), t, env.Client, wg)
	data, err := os.ReadFile("../../api/crds/testdata/seed004/policy-any-ec2-in-accounts.yaml")
	must(t, err)
	p := &authorizationv1alpha1.OnboardingPolicy{}
	must(t, yaml.UnmarshalStrict(data, p))
	p.Namespace = ns
	must(t, env.Client.Create(t.Context(), p))
	return w
}

func (w *servingWorld) start(t *testing.T) {
	t.Helper()
	w.ep = endpointkit.Start(t, endpointkit.Options{Config: w.cfg, Kubeconfig: env.KubeconfigPath, Replica: "serving-" + w.ns, Dir: w.dir})
}

// restart stops the endpoint as a rolling update does and starts it again.
func (w *servingWorld) restart(t *testing.T) {
	t.Helper()
	w.ep.Stop()
	w.start(t)
}

// servingPair is a serving certificate and its key.
type servingPair struct {
	certPEM, keyPEM []byte
	serial          *big.Int
}

// issue makes a serving certificate of ca for servingHost and 127.0.0.1.
func (w *servingWorld) issue(t *testing.T, ca *authority) servingPair {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	w.serial++
	serial := big.NewInt(1000 + w.serial)
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: servingHost},
		DNSNames: []string{servingHost}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	must(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	must(t, err)
	return servingPair{certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), serial: serial}
}

// serve installs p as the endpoint's serving certificate: the files
// replaced (key first, then certificate, each atomically, as the kubelet's
// projection swaps them together), or the TLS Secret updated.
func (w *servingWorld) serve(t *testing.T, p servingPair) {
	t.Helper()
	if !w.fromSecret {
		must(t, writeAtomic(w.cfg.Endpoint.KeyFile, p.keyPEM))
		must(t, writeAtomic(w.cfg.Endpoint.CertFile, p.certPEM))
		return
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: w.cfg.Endpoint.SecretName}}
	err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(sec), sec)
	sec.Type = corev1.SecretTypeTLS
	sec.Data = map[string][]byte{corev1.TLSCertKey: p.certPEM, corev1.TLSPrivateKeyKey: p.keyPEM}
	if err != nil {
		must(t, env.Client.Create(t.Context(), sec))
		return
	}
	must(t, env.Client.Update(t.Context(), sec))
}

// publish writes the roots the endpoint sends to VMs (mesh.rootCertFile);
// the first publication is also the agent's onboardingEndpoint.caCertificates,
// which is never changed afterwards.
func (w *servingWorld) publish(t *testing.T, cas ...*authority) {
	t.Helper()
	var b []byte
	for _, ca := range cas {
		b = append(b, ca.pem...)
	}
	must(t, writeAtomic(w.publishedFile, b))
	if _, err := os.Stat(w.agentCAFile); err != nil {
		must(t, os.WriteFile(w.agentCAFile, b, 0o644))
	}
}

func (w *servingWorld) rootsFile() string {
	return filepath.Join(w.root, "etc/certs/embark-root-cert.pem")
}

// onboard runs the real onboarding agent (sidecar restart commands that
// only count) until the test ends and waits for its registration.
func (w *servingWorld) onboard(t *testing.T) *workload {
	t.Helper()
	must(t, os.MkdirAll(w.root, 0o755))
	agentFile, onboardingFile := filepath.Join(w.dir, "agent.config.yaml"), filepath.Join(w.dir, "onboarding.config.yaml")
	must(t, os.WriteFile(agentFile, []byte(fmt.Sprintf(`apiVersion: config.agent.onboarding.tetrate.io/v1alpha1
kind: AgentConfiguration
host:
  aws:
    imdsEndpoint: %s
    stsEndpoint: %s
sidecar:
  istio:
    version: 1.30.0
  bootstrap:
    clusterEnv: %[3]s/var/lib/istio/envoy/cluster.env
    meshConfig: %[3]s/etc/istio/config/mesh
    rootCert: %[3]s/etc/certs/embark-root-cert.pem
    token: %[3]s/var/run/secrets/tokens/istio-token
  restartCommand: ["/bin/sh", "-c", "echo restart >> %[3]s/restarts"]
  stopCommand: ["/bin/sh", "-c", "echo stop >> %[3]s/stops"]
`, w.aws.IMDS.URL, w.aws.STS.URL, w.root)), 0o600))
	must(t, os.WriteFile(onboardingFile, []byte(fmt.Sprintf(`apiVersion: config.agent.onboarding.tetrate.io/v1alpha1
kind: OnboardingConfiguration
onboardingEndpoint:
  host: %s
  tlsServerName: %s
  caCertificates: %s
workload:
  namespace: %s
  name: %s
`, w.cfg.Listen.Onboarding, servingHost, w.agentCAFile, w.ns, fixtures.GroupName)), 0o600))
	agentCfg, err := agentconfig.LoadAgent(agentFile)
	must(t, err)
	onbCfg, err := agentconfig.LoadOnboarding(onboardingFile)
	must(t, err)
	log := slog.New(slog.NewTextHandler(w.logs, nil))
	plat, err := platform.Detect(t.Context(), agentCfg.Host, onbCfg.Audience(), log)
	must(t, err)
	// 1h sidecar tokens renewed every ~11 s: each renewal brings the roots.
	a, err := agent.New(agent.Options{Agent: agentCfg, Onboarding: onbCfg, Platform: plat, Version: "v0.0.0-test", Logger: log,
		MinBackoff: 100 * time.Millisecond, MaxBackoff: 2 * time.Second, SidecarRenewFraction: 0.003})
	must(t, err)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	fixtures.Eventually(t, time.Minute, "the VM onboarded", func() bool { return countLines(filepath.Join(w.root, "restarts")) == 1 })
	list := &runtimev1alpha1.WorkloadAutoRegistrationList{}
	must(t, env.Client.List(t.Context(), list, client.InNamespace(w.ns)))
	if len(list.Items) != 1 {
		t.Fatalf("%d registrations, want 1", len(list.Items))
	}
	war := list.Items[0]
	return &workload{VM: &meshkit.VM{Key: client.ObjectKeyFromObject(&war), UID: string(war.UID), IP: war.Spec.Registration.Host.Addresses[0].IP}}
}

// envoyADS holds an ADS stream through pilot-agent's xDS proxy as Envoy
// does: listeners requested and ACKed, the stream opened again when it
// ends (pilot-agent closes it when its upstream stream to the endpoint
// ends, and opens a new upstream stream for the new one).
type envoyADS struct {
	mu      sync.Mutex
	lastLDS time.Time
	streams int // streams that got listeners
}

func holdADS(t *testing.T, pa *istioagent.Agent) *envoyADS {
	t.Helper()
	e := &envoyADS{}
	ctx := t.Context()
	go func() {
		for ctx.Err() == nil {
			e.stream(ctx, pa)
			time.Sleep(500 * time.Millisecond)
		}
	}()
	return e
}

func (e *envoyADS) stream(ctx context.Context, pa *istioagent.Agent) {
	ads, err := istioagent.Connect(ctx, pa)
	if err != nil {
		return
	}
	defer func() { _ = ads.Close() }()
	if err := ads.Send(resource.ListenerType, nil, "", ""); err != nil {
		return
	}
	for first := true; ; first = false {
		resp, err := ads.Recv(ctx)
		if err != nil {
			return
		}
		e.mu.Lock()
		e.lastLDS = time.Now()
		if first {
			e.streams++
		}
		e.mu.Unlock()
		if err := ads.ACK(resp); err != nil {
			return
		}
	}
}

// waitLDSAfter waits for listeners received after since.
func (e *envoyADS) waitLDSAfter(t *testing.T, pa *istioagent.Agent, since time.Time, what string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.lastLDS.After(since), nil
	})
	if err != nil {
		t.Fatalf("%s: no listeners through pilot-agent: %v\n%s", what, err, meshkit.Tail(pa.Logs()))
	}
}

func (e *envoyADS) opened() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.streams
}

// servingState is one sample: the certificate the endpoint's xDS listener
// serves and the CAs installed on the VM.
type servingState struct {
	issuer    string
	serial    *big.Int
	installed map[string]bool // by common name
	// verifyErr is the served chain verified against the installed roots.
	verifyErr error
}

func (w *servingWorld) read() (servingState, error) {
	s := servingState{installed: map[string]bool{}}
	data, err := os.ReadFile(w.rootsFile())
	if err != nil {
		return s, err
	}
	roots, err := parsePEM(data)
	if err != nil {
		return s, err
	}
	for _, r := range roots {
		s.installed[r.Subject.CommonName] = true
	}
	// A bound on a dial to a stopped endpoint, not a timing assertion.
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", w.cfg.Listen.XDS,
		&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // the chain is verified below, against the VM's roots
	if err != nil {
		return s, err
	}
	defer func() { _ = conn.Close() }()
	chain := conn.ConnectionState().PeerCertificates
	s.issuer, s.serial = chain[0].Issuer.CommonName, chain[0].SerialNumber
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	_, s.verifyErr = chain[0].Verify(x509.VerifyOptions{Roots: pool, DNSName: "127.0.0.1"})
	return s, nil
}

func (w *servingWorld) waitFor(t *testing.T, what string, done func(servingState) bool) {
	t.Helper()
	var last servingState
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		s, err := w.read()
		if err != nil {
			return false, nil
		}
		last = s
		return done(s), nil
	})
	if err != nil {
		t.Fatalf("%s: not reached: served by %q, installed %v\nagent log:\n%s", what, last.issuer, last.installed, meshkit.Tail(w.logs.String()))
	}
}

// sample verifies the served certificate against the VM's installed roots
// every sampleEvery until the returned function is called.
func (w *servingWorld) sample(t *testing.T) func() sampleStats {
	t.Helper()
	return sampleUntilStopped(t, func(context.Context) ([]string, error) {
		s, err := w.read()
		if err != nil {
			return nil, err
		}
		if s.verifyErr != nil {
			return []string{fmt.Sprintf("served by %q: %v (installed %v)", s.issuer, s.verifyErr, s.installed)}, nil
		}
		return nil, nil
	})
}

func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func countLines(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "\n")
}

// envoySDS is one SDS resource as Envoy holds it: like watchSDS, but the
// stream is opened again when pilot-agent closes it, as Envoy does.
type envoySDS struct {
	mu     sync.Mutex
	secret *sdsSecret
	opens  int
}

func watchSDSAsEnvoy(t *testing.T, pa *istioagent.Agent, node *core.Node, name string) *envoySDS {
	t.Helper()
	e := &envoySDS{secret: watchSDS(t, pa, node, name), opens: 1}
	// The goroutine reopens streams without t (no t.Fatal or t.Cleanup off
	// the test's goroutine): its streams end with ctx, their connections
	// are closed by the cleanup below, after the goroutine has stopped.
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan struct{})
	var closers []func()
	t.Cleanup(func() {
		cancel()
		<-done
		for _, c := range closers {
			c()
		}
	})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			time.Sleep(500 * time.Millisecond)
			e.mu.Lock()
			cur := e.secret
			e.mu.Unlock()
			if _, err := cur.last(); err == nil || ctx.Err() != nil {
				continue
			}
			st, closeConn, err := meshkit.DialSDS(ctx, pa, node, name)
			if err != nil {
				continue
			}
			closers = append(closers, closeConn)
			next := &sdsSecret{}
			go next.receive(st, name)
			e.mu.Lock()
			e.secret, e.opens = next, e.opens+1
			e.mu.Unlock()
		}
	}()
	return e
}

func (e *envoySDS) serial() *big.Int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return servedSerial(e.secret)
}

func (e *envoySDS) reopened() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.opens - 1
}

// servedSerial is the serial of the workload certificate pilot-agent serves
// over SDS, or nil.
func servedSerial(s *sdsSecret) *big.Int {
	sec, err := s.last()
	if err != nil || sec == nil {
		return nil
	}
	chain, err := parsePEM(sec.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
	if err != nil || len(chain) == 0 {
		return nil
	}
	return chain[0].SerialNumber
}
