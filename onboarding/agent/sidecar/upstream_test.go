package sidecar_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/agent/sidecar"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/test/adsclient"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/freeport"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/vmsim"
)

// Stand-in user and group IDs of the VM: istio-proxy (which pilot-agent runs
// as) and onboarding-agent (which owns the token directory).
const (
	istioProxyUID = 61337
	agentUID      = 61338
)

// TestUpstreamIstioStartScript runs Istio's own istio-start.sh — the
// ExecStart of the istio.service unit of Istio's istio-sidecar package, read
// from the pinned Istio module, unmodified — on the files the agent stages
// and onboarding-agent-sidecar.service installs, in a directory laid out as
// Istio's postinst lays out a VM (the script's paths are relative to its
// working directory). It checks that pilot-agent (the real one) starts with
// Embark's discovery address and CA address from cluster.env, builds the
// node ID from the registration, reads the token the agent wrote as
// istio-proxy would, and that no iptables command runs.
//
// Stand-ins, because no real part exists here: Envoy (pilot-agent runs with
// DISABLE_ENVOY=true; the test dials its XDS socket as Envoy would), systemd
// (the test runs the script as the unit would after Apply's restart), and
// the iptables commands (PATH stubs that record a call and fail; the
// pilot-agent in ISTIO_BIN_BASE is a wrapper that records its arguments, so
// `pilot-agent istio-iptables` would be seen). As root, the script runs as
// the stand-in istio-proxy UID with its group, so the file permissions are
// the VM's; as another user it runs as that user.
func TestUpstreamIstioStartScript(t *testing.T) {
	pilotAgent, err := istioagent.BinaryPath("pilot-agent", "")
	if err != nil {
		t.Fatal(err)
	}
	script, sidecarEnv := upstreamPackagingFiles(t)
	asRoot := os.Geteuid() == 0

	host := t.TempDir()
	// The istio-proxy stand-in must reach it: t.TempDir's parent is 0700.
	must(t, os.Chmod(filepath.Dir(host), 0o755))
	must(t, os.Chmod(host, 0o755))
	mk := func(rel string, mode os.FileMode, uid, gid int) string {
		p := filepath.Join(host, rel)
		must(t, os.MkdirAll(p, 0o755))
		if asRoot {
			must(t, os.Chown(p, uid, gid))
		}
		must(t, os.Chmod(p, mode)) // after chown, which clears set-group-ID
		return p
	}
	// Istio's postinst: /etc/istio -> /var/lib/istio; envoy, config, proxy,
	// /etc/certs and /var/log/istio owned by istio-proxy. istio.service's
	// ExecStartPre: /var/run/secrets owned by istio-proxy. The agent
	// package's tmpfiles.d: /run/secrets/tokens 2750 onboarding-agent:istio-proxy.
	for _, d := range []string{"var/lib/istio/envoy", "var/lib/istio/config", "var/lib/istio/proxy", "etc/certs", "var/log/istio", "var/run/secrets"} {
		mk(d, 0o755, istioProxyUID, istioProxyUID)
	}
	must(t, os.Symlink("../var/lib/istio", filepath.Join(host, "etc/istio")))
	mk("var/run/secrets/tokens", 0o750|os.ModeSetgid, agentUID, istioProxyUID)
	must(t, os.WriteFile(filepath.Join(host, "var/lib/istio/envoy/sidecar.env"), sidecarEnv, 0o644))

	// Embark's discovery address and, on another port to tell them apart,
	// its CA address, both TLS with the root the bootstrap carries.
	rootPEM, serverCert := serverTLS(t)
	xds, ca := &recorder{}, &recorder{}
	xdsAddr := serveGRPC(t, serverCert, func(s *grpc.Server) { discoveryv3.RegisterAggregatedDiscoveryServiceServer(s, &adsRecorder{rec: xds}) })
	caAddr := serveGRPC(t, serverCert, func(s *grpc.Server) { securityv1alpha1.RegisterIstioCertificateServiceServer(s, &caRecorder{rec: ca}) })

	statusPort := freePort(t)
	const token = "embark.sidecar.token"
	boot := &onboardingv1alpha1.SidecarBootstrap{
		DiscoveryAddress: xdsAddr,
		ClusterId:        "Kubernetes",
		Network:          "vm-network",
		ServiceAccount:   fixtures.ServiceAccount,
		TrustDomain:      "cluster.local",
		Labels:           map[string]string{"app": "ratings", "version": "v5"},
		InstanceIp:       "10.11.12.13",
		ProxyConfigJson:  fmt.Sprintf(`{"statusPort":%d,"readinessProbe":{"tcpSocket":{"port":8080},"periodSeconds":5}}`, statusPort),
		RootCertificates: rootPEM,
		SidecarToken:     token,
	}
	paths := config.BootstrapFiles{
		ClusterEnv: filepath.Join(host, "var/lib/istio/envoy/cluster.env"),
		MeshConfig: filepath.Join(host, "etc/istio/config/mesh"),
		RootCert:   filepath.Join(host, "etc/certs/embark-root-cert.pem"),
		Token:      filepath.Join(host, "var/run/secrets/tokens/istio-token"),
	}
	// The agent stages and writes the token; the root side installs.
	staging := t.TempDir()
	files := &sidecar.Files{Paths: paths, Env: sidecar.EnvOptions{CAAddress: caAddr}}
	id := sidecar.Identity{Namespace: "bookinfo", RegistrationName: "ratings-vm1"}
	must(t, files.Stage(staging, id, boot))
	must(t, sidecar.Request(staging, sidecar.RequestRestart, 1))
	var restarted []string
	if _, err := sidecar.Apply(t.Context(), sidecar.ApplyOptions{StagingDir: staging, Paths: paths, Unit: "istio.service",
		Systemctl: func(_ context.Context, verb, unit string) error {
			restarted = append(restarted, verb+" "+unit)
			return nil
		}}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(restarted, ",") != "restart istio.service" {
		t.Fatalf("systemctl calls %v", restarted)
	}
	if asRoot {
		info, err := os.Stat(paths.Token)
		must(t, err)
		if st := info.Sys().(*syscall.Stat_t); st.Gid != istioProxyUID || info.Mode().Perm() != 0o640 {
			t.Fatalf("token group %d mode %v: want istio-proxy's group, 0640", st.Gid, info.Mode())
		}
	}

	// ISTIO_BIN_BASE: a recording wrapper around the real pilot-agent.
	calls := mk("calls", 0o777, 0, 0)
	bin := mk("usr/local/bin", 0o755, 0, 0)
	writeExec(t, filepath.Join(bin, "pilot-agent"), fmt.Sprintf("#!/bin/sh\necho \"pilot-agent $*\" >> %s/log\nexec %s \"$@\"\n", calls, pilotAgent))
	stubs := mk("stubs", 0o755, 0, 0)
	for _, c := range []string{"iptables", "ip6tables", "iptables-restore", "ip6tables-restore", "iptables-save", "ip6tables-save", "iptables-legacy", "iptables-nft", "ipset", "ip", "nft"} {
		writeExec(t, filepath.Join(stubs, c), fmt.Sprintf("#!/bin/sh\necho \"%s $*\" >> %s/log\nexit 1\n", c, calls))
	}

	ctx, cancel := context.WithCancel(t.Context())
	// bash -c with the script's text: the module cache under /root is not
	// readable by the istio-proxy stand-in; the script itself is unchanged.
	cmd := exec.CommandContext(ctx, "/bin/bash", "-c", string(script), "istio-start.sh")
	cmd.Dir = host
	user := "istio-proxy"
	if !asRoot {
		user = os.Getenv("USER")
	}
	cmd.Env = []string{
		"PATH=" + stubs + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + host,
		// istio-start.sh starts pilot-agent directly when it already runs
		// as EXEC_USER (istio-proxy); as root it would sudo to it.
		"USER=" + user, "EXEC_USER=" + user,
		"ISTIO_BIN_BASE=" + bin,
		"DISABLE_ENVOY=true", // the Envoy stand-in
		"CLOUD_PLATFORM=none",
	}
	logs := &vmsim.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if asRoot {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: istioProxyUID, Gid: istioProxyUID, NoSetGroups: false, Groups: []uint32{}}
	}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	must(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cancel(); <-done })

	// pilot-agent asks CA_ADDR for its certificate with the token.
	waitFor(t, done, logs, "a certificate request at CA_ADDR", func() bool { return ca.count() > 0 })
	if got := ca.first(); got.auth != "Bearer "+token {
		t.Errorf("CA request authorization %q, want the agent's token", got.auth)
	}

	// Play Envoy: pilot-agent relays to PILOT_ADDRESS, with the token.
	bootstrapFile := filepath.Join(host, "etc/istio/proxy/grpc-bootstrap.json")
	waitFor(t, done, logs, "pilot-agent's gRPC bootstrap", func() bool { _, err := os.Stat(bootstrapFile); return err == nil })
	node := readNode(t, bootstrapFile)
	wantID := fixtures.NodeID("10.11.12.13", types.NamespacedName{Namespace: "bookinfo", Name: "ratings-vm1"})
	if node.GetId() != wantID {
		t.Errorf("node ID %q, want %q", node.GetId(), wantID)
	}
	conn, err := adsclient.Dial("unix://" + filepath.Join(host, "etc/istio/proxy/XDS"))
	must(t, err)
	defer func() { _ = conn.Close() }()
	stream, err := adsclient.OpenSotW(ctx, conn, "", node)
	must(t, err)
	defer stream.Close()
	must(t, stream.Request("type.googleapis.com/envoy.config.cluster.v3.Cluster"))
	waitFor(t, done, logs, "an ADS stream at PILOT_ADDRESS", func() bool { return xds.count() > 0 })
	got := xds.first()
	if got.auth != "Bearer "+token {
		t.Errorf("ADS authorization %q, want the agent's token", got.auth)
	}
	if got.nodeID != wantID {
		t.Errorf("upstream node ID %q, want %q", got.nodeID, wantID)
	}
	for k, want := range map[string]string{"CLUSTER_ID": "Kubernetes", "NETWORK": "vm-network", "INTERCEPTION_MODE": "NONE", "WORKLOAD_NAME": "ratings-vm1"} {
		if v := got.meta[k]; v != want {
			t.Errorf("node metadata %s = %q, want %q", k, v, want)
		}
	}

	callLog, _ := os.ReadFile(filepath.Join(calls, "log"))
	lines := strings.Split(strings.TrimSpace(string(callLog)), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "pilot-agent proxy") {
		t.Errorf("commands run by istio-start.sh: %q; want only `pilot-agent proxy` (no istio-iptables, no iptables)", lines)
	}
}

// upstreamPackagingFiles reads istio-start.sh and sidecar.env from the
// pinned Istio module (test/tools/istio/go.mod).
func upstreamPackagingFiles(t *testing.T) (script, sidecarEnv []byte) {
	t.Helper()
	toolsDir, err := filepath.Abs("../../../test/tools/istio")
	must(t, err)
	list := func() (string, error) {
		cmd := exec.CommandContext(t.Context(), "go", "list", "-m", "-f", "{{.Dir}}", "istio.io/istio")
		cmd.Dir = toolsDir
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err
	}
	dir, err := list()
	if err != nil || dir == "" {
		dl := exec.CommandContext(t.Context(), "go", "mod", "download", "istio.io/istio")
		dl.Dir = toolsDir
		if out, err := dl.CombinedOutput(); err != nil {
			t.Fatalf("go mod download istio.io/istio: %v: %s", err, out)
		}
		if dir, err = list(); err != nil || dir == "" {
			t.Fatalf("locate the pinned Istio module: %v", err)
		}
	}
	script, err = os.ReadFile(filepath.Join(dir, "tools/packaging/common/istio-start.sh"))
	must(t, err)
	sidecarEnv, err = os.ReadFile(filepath.Join(dir, "tools/packaging/common/sidecar.env"))
	must(t, err)
	return script, sidecarEnv
}

type call struct {
	auth, nodeID string
	meta         map[string]string
}

type recorder struct {
	mu    sync.Mutex
	calls []call
}

func (r *recorder) add(ctx context.Context, node *corev3.Node) {
	md, _ := metadata.FromIncomingContext(ctx)
	c := call{auth: strings.Join(md.Get("authorization"), ","), nodeID: node.GetId(), meta: map[string]string{}}
	for k, v := range node.GetMetadata().GetFields() {
		c.meta[k] = v.GetStringValue()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

func (r *recorder) first() call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[0]
}

type adsRecorder struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer
	rec *recorder
}

func (a *adsRecorder) StreamAggregatedResources(s discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	req, err := s.Recv()
	if err != nil {
		return err
	}
	a.rec.add(s.Context(), req.GetNode())
	<-s.Context().Done()
	return nil
}

type caRecorder struct {
	securityv1alpha1.UnimplementedIstioCertificateServiceServer
	rec *recorder
}

func (c *caRecorder) CreateCertificate(ctx context.Context, _ *securityv1alpha1.IstioCertificateRequest) (*securityv1alpha1.IstioCertificateResponse, error) {
	c.rec.add(ctx, nil)
	return nil, status.Error(codes.Unavailable, "test CA records requests only")
}

func serveGRPC(t *testing.T, cert tls.Certificate, register func(*grpc.Server)) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	register(s)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

func readNode(t *testing.T, path string) *corev3.Node {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	var boot struct {
		Node json.RawMessage `json:"node"`
	}
	must(t, json.Unmarshal(b, &boot))
	node := &corev3.Node{}
	must(t, protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(boot.Node, node))
	delete(node.GetMetadata().GetFields(), "GENERATOR")
	return node
}

// waitFor waits up to 60s for cond, failing at once when istio-start.sh
// exits first.
func waitFor(t *testing.T, done chan error, logs *vmsim.SyncBuffer, what string, cond func() bool) {
	t.Helper()
	var exited bool
	var exitErr error
	err := fixtures.Poll(t.Context(), 50*time.Millisecond, 60*time.Second, func() error {
		if cond() {
			return nil
		}
		select {
		case exitErr = <-done:
			done <- exitErr
			exited = true
			return nil
		default:
			return errors.New("not yet")
		}
	})
	switch {
	case exited:
		t.Fatalf("istio-start.sh exited (%v) before %s:\n%s", exitErr, what, logs.String())
	case err != nil:
		t.Fatalf("no %s after 60s; istio-start.sh output:\n%s", what, logs.String())
	}
}

func writeExec(t *testing.T, path, content string) {
	t.Helper()
	must(t, os.WriteFile(path, []byte(content), 0o755))
}

func freePort(t *testing.T) int {
	t.Helper()
	return freeport.MustPort(t)
}

// serverTLS returns a root PEM and a serving certificate for 127.0.0.1
// signed by it.
func serverTLS(t *testing.T) ([]byte, tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test mesh root"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	must(t, err)
	ca, err := x509.ParseCertificate(caDER)
	must(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	leafDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "embark"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}, ca, &key.PublicKey, caKey)
	must(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
