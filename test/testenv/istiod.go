package testenv

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/test/freeport"
)

// IstiodNamespace is the namespace the test istiod runs "in" (POD_NAMESPACE):
// its root namespace and where it keeps its CA.
const IstiodNamespace = "istio-system"

// IstiodServerName is the DNS name in istiod's own serving certificate, which
// clients of its secure port verify (Istio's ISTIOD_SAN).
const IstiodServerName = "istiod.istio-system.svc"

// IstiodOptions configures StartIstiod. The zero value runs istiod with
// Istio's defaults for auto-registration and health checks.
type IstiodOptions struct {
	// MaxConnectionAge is istiod's --keepaliveMaxServerConnectionAge.
	// Default: unset (infinite, Istio's binary default; Istio's Helm chart
	// sets 30m).
	MaxConnectionAge time.Duration
	// WorkloadEntryGracePeriod is PILOT_WORKLOAD_ENTRY_GRACE_PERIOD: how long
	// istiod waits before it cleans up a WorkloadEntry it believes it
	// auto-registered; it checks every 10 × this. Default: unset (Istio's
	// default, 10s).
	WorkloadEntryGracePeriod time.Duration
	// TrustDomain of the mesh. Default: cluster.local.
	TrustDomain string
	// CACertsDir is a plugged-in CA for istiod (ROOT_CA_DIR, /etc/cacerts in
	// a cluster, mounted from the Secret cacerts): a directory holding
	// ca-cert.pem, ca-key.pem, cert-chain.pem and root-cert.pem. istiod
	// signs with it instead of its self-signed CA and watches the directory,
	// reloading the files when they change. Default: unset (istiod's
	// self-signed CA).
	CACertsDir string
	// Env holds extra environment variables for pilot-discovery (KEY=VALUE).
	Env []string
	// Output receives istiod's logs besides its log file. Default: only the
	// log file (see Istiod.LogPath).
	Output *os.File
}

// Istiod is a real istiod (pilot-discovery, built by `make testenv` from the
// pinned Istio module) running out of cluster against an Env: it reads the
// Env's API server with the admin kubeconfig, authenticates proxies with
// TokenReview, signs workload certificates with its own self-signed CA
// (secret istio-ca-secret in istio-system) or the plugged-in CA of
// IstiodOptions.CACertsDir, and runs its WorkloadEntry
// auto-registration and clean-up controllers, as in a cluster.
type Istiod struct {
	// GRPCAddr is istiod's plaintext gRPC port: xDS with no authentication
	// (what `istioctl proxy-status --plaintext` talks to; tests only).
	GRPCAddr string
	// SecureGRPCAddr is istiod's TLS gRPC port (15012 in a cluster): xDS
	// and the certificate service (istio.v1.auth.IstioCertificateService),
	// both authenticated by the caller's token. Verify it with RootCert and
	// IstiodServerName.
	SecureGRPCAddr string
	// HTTPAddr serves /ready and the /debug endpoints (15014's debug set).
	HTTPAddr string
	// MonitoringAddr serves istiod's Prometheus metrics.
	MonitoringAddr string
	// TrustDomain of the mesh.
	TrustDomain string
	// RootCert is the PEM root of istiod's CA: what workloads trust.
	RootCert []byte
	// LogPath is istiod's log file.
	LogPath string

	env     *Env
	bin     string
	dir     string
	args    []string
	environ []string
	output  *os.File

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// StartIstiod starts a real istiod against e and waits until it is ready and
// has created its CA root. The caller must Stop it. Each test package that
// needs istiod starts its own (about 2 s); others do not pay for it.
func StartIstiod(ctx context.Context, e *Env, opts IstiodOptions) (*Istiod, error) {
	assets, err := AssetsDir("")
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(assets, "pilot-discovery")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("istiod binary missing: run `make testenv` (it builds pilot-discovery): %w", err)
	}
	if opts.TrustDomain == "" {
		opts.TrustDomain = "cluster.local"
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: IstiodNamespace}}
	if err := e.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create namespace %s: %w", IstiodNamespace, err)
	}
	dir, err := os.MkdirTemp("", "embark-istiod-")
	if err != nil {
		return nil, fmt.Errorf("create istiod work dir: %w", err)
	}
	ports, err := freePorts(6)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	addr := func(i int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[i])) }
	i := &Istiod{
		GRPCAddr:       addr(0),
		SecureGRPCAddr: addr(1),
		HTTPAddr:       addr(2),
		MonitoringAddr: addr(4),
		TrustDomain:    opts.TrustDomain,
		LogPath:        filepath.Join(dir, "istiod.log"),
		env:            e,
		bin:            bin,
		dir:            dir,
		output:         opts.Output,
	}
	mesh := fmt.Sprintf("rootNamespace: %s\ntrustDomain: %s\ndefaultConfig:\n  discoveryAddress: %s\n",
		IstiodNamespace, opts.TrustDomain, i.SecureGRPCAddr)
	if err := os.WriteFile(filepath.Join(dir, "mesh.yaml"), []byte(mesh), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("write mesh config: %w", err)
	}
	i.args = []string{
		"discovery",
		"--kubeconfig=" + e.KubeconfigPath,
		"--meshConfig=" + filepath.Join(dir, "mesh.yaml"),
		"--networksConfig=" + filepath.Join(dir, "absent-networks.yaml"),
		"--domain=cluster.local",
		"--grpcAddr=" + i.GRPCAddr,
		"--secureGRPCAddr=" + i.SecureGRPCAddr,
		"--httpAddr=" + i.HTTPAddr,
		"--httpsAddr=" + addr(3),
		"--monitoringAddr=" + i.MonitoringAddr,
		"--ctrlz_port=" + strconv.Itoa(ports[5]),
		"--log_output_level=default:info",
	}
	if opts.MaxConnectionAge > 0 {
		i.args = append(i.args, "--keepaliveMaxServerConnectionAge="+opts.MaxConnectionAge.String())
	}
	i.environ = append(os.Environ(),
		"POD_NAMESPACE="+IstiodNamespace,
		"POD_NAME=istiod-local",
		"REVISION=default",
		"CLUSTER_ID=Kubernetes",
		"JWT_POLICY=third-party-jwt",
		"PILOT_CERT_PROVIDER=istiod",
		"ENABLE_CA_SERVER=true",
		"ENABLE_DEBUG_ENDPOINT_AUTH=false",
	)
	if opts.WorkloadEntryGracePeriod > 0 {
		i.environ = append(i.environ, "PILOT_WORKLOAD_ENTRY_GRACE_PERIOD="+opts.WorkloadEntryGracePeriod.String())
	}
	if opts.CACertsDir != "" {
		i.environ = append(i.environ, "ROOT_CA_DIR="+opts.CACertsDir)
	}
	i.environ = append(i.environ, opts.Env...)
	if err := i.Start(ctx); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return i, nil
}

// Start starts istiod (again, after Stop: same addresses, same CA) and waits
// until /ready answers 200 and its CA root is published.
func (i *Istiod) Start(ctx context.Context) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.cmd != nil {
		return errors.New("istiod already running")
	}
	logf, err := os.OpenFile(i.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("open istiod log: %w", err)
	}
	cmd := exec.Command(i.bin, i.args...)
	cmd.Dir = i.dir
	cmd.Env = i.environ
	if i.output != nil {
		cmd.Stdout = io.MultiWriter(logf, i.output)
	} else {
		cmd.Stdout = logf
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("start istiod: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(done) }()
	i.cmd, i.done = cmd, done

	if err := i.waitReady(ctx, done); err != nil {
		i.stopLocked()
		return fmt.Errorf("%w\nistiod log (tail):\n%s", err, i.logTail(40))
	}
	return nil
}

func (i *Istiod) waitReady(ctx context.Context, done <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second}
	for {
		select {
		case <-done:
			return errors.New("istiod exited before it was ready")
		case <-ctx.Done():
			return fmt.Errorf("istiod not ready on %s: %w", i.HTTPAddr, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
		resp, err := hc.Get("http://" + i.HTTPAddr + "/ready")
		if err != nil {
			continue
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			continue
		}
		var cm corev1.ConfigMap
		key := client.ObjectKey{Namespace: IstiodNamespace, Name: "istio-ca-root-cert"}
		if err := i.env.Client.Get(ctx, key, &cm); err != nil {
			continue
		}
		root := []byte(cm.Data["root-cert.pem"])
		if !validPEMCerts(root) {
			continue
		}
		i.RootCert = root
		return nil
	}
}

// Stop stops istiod (SIGTERM, then SIGKILL after 10 s). It can be started
// again with Start.
func (i *Istiod) Stop() {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.stopLocked()
}

// Kill stops istiod at once (SIGKILL), as a crash would.
func (i *Istiod) Kill() {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.cmd == nil {
		return
	}
	_ = i.cmd.Process.Kill()
	<-i.done
	i.cmd = nil
}

// Pause freezes istiod (SIGSTOP), as an overloaded istiod: its
// connections stay open but nothing is answered until Resume.
func (i *Istiod) Pause() { i.signal(syscall.SIGSTOP) }

// Resume continues a paused istiod (SIGCONT).
func (i *Istiod) Resume() { i.signal(syscall.SIGCONT) }

func (i *Istiod) signal(sig syscall.Signal) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.cmd != nil {
		_ = i.cmd.Process.Signal(sig)
	}
}

func (i *Istiod) stopLocked() {
	if i.cmd == nil {
		return
	}
	Terminate(i.cmd.Process, syscall.SIGTERM, i.done, 10*time.Second)
	i.cmd = nil
}

// Close stops istiod and removes its files.
func (i *Istiod) Close() error {
	i.Stop()
	return os.RemoveAll(i.dir)
}

// Log returns istiod's log so far, for failure messages.
func (i *Istiod) Log() string {
	data, _ := os.ReadFile(i.LogPath)
	return string(data)
}

func (i *Istiod) logTail(n int) string {
	lines := strings.Split(strings.TrimRight(i.Log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// RootPool returns istiod's CA root as a certificate pool.
func (i *Istiod) RootPool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(i.RootCert)
	return p
}

func validPEMCerts(data []byte) bool {
	return len(bytes.TrimSpace(data)) > 0 && x509.NewCertPool().AppendCertsFromPEM(data)
}

// freePorts returns n distinct loopback ports free now (see package
// freeport).
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		p, err := freeport.Port()
		if err != nil {
			return nil, err
		}
		ports = append(ports, p)
	}
	return ports, nil
}
