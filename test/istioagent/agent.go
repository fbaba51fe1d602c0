package istioagent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/embark-mesh/embark/test/freeport"
)

// Paths inside an agent's working directory, as pilot-agent resolves them
// relative to its own working directory.
const (
	xdsSocketPath      = "etc/istio/proxy/XDS"
	grpcBootstrapPath  = "etc/istio/proxy/grpc-bootstrap.json"
	tokenPath          = "var/run/secrets/tokens/istio-token"
	xdsRootCAPath      = "etc/xds-root-ca/root-cert.pem"
	caRootCAPath       = "etc/ca-root/root-cert.pem"
	outputCertsPath    = "etc/istio/output-certs"
	sdsSocketPath      = "var/run/secrets/workload-spiffe-uds/socket"
	envoyStandInPath   = "usr/local/bin/envoy"
	envoyStandInConfig = "etc/istio/proxy/envoy-stand-in.json"
	resolvConfPath     = "etc/resolv.conf"
)

// withResolvConf runs cmd in a mount namespace of its own where file is
// bind-mounted over /etc/resolv.conf: unshare(1) starts a shell that mounts
// it and execs cmd, so the process the test waits for and signals is
// pilot-agent itself. Without root, a user namespace maps the caller to
// root for the mount.
func withResolvConf(cmd *exec.Cmd, file string) *exec.Cmd {
	args := []string{"--mount", "--propagation", "private"}
	if os.Geteuid() != 0 {
		args = append(args, "--map-root-user")
	}
	args = append(args, "/bin/sh", "-c", `mount --bind "$0" /etc/resolv.conf && exec "$@"`, file)
	return exec.Command("unshare", append(args, cmd.Args...)...)
}

// envoyStandInScript stands in for Envoy's binary (Options.EnvoyStandIn): it
// does nothing, and exits when pilot-agent, its parent, stops it or is
// gone.
const envoyStandInScript = `#!/bin/sh
# Stand-in for Envoy (test/istioagent): does nothing until stopped.
while kill -0 "$PPID" 2>/dev/null; do sleep 1; done
`

// Options configures Start. Every field is optional except a discovery address
// (DiscoveryAddress or ProxyConfig.DiscoveryAddress).
type Options struct {
	// DiscoveryAddress is the host:port of the xDS server pilot-agent connects
	// to upstream (Embark's). Used when ProxyConfig.DiscoveryAddress is empty.
	DiscoveryAddress string

	// PodName (POD_NAME) names the workload. Default: "vm-1".
	PodName string
	// PodNamespace (POD_NAMESPACE) is the workload's namespace. Default: "default".
	PodNamespace string
	// InstanceIP (INSTANCE_IP) is the workload's IP: the second field of the node
	// ID and the default host of readiness probes. Default: "127.0.0.1".
	InstanceIP string
	// ClusterID (ISTIO_META_CLUSTER_ID) becomes the node's CLUSTER_ID metadata and
	// the upstream "ClusterID" header. Default: "Kubernetes".
	ClusterID string
	// ServiceAccount (SERVICE_ACCOUNT) is the workload's service account (the
	// node's SERVICE_ACCOUNT metadata; its certificate's identity comes from
	// the token, not from this). Default: unset.
	ServiceAccount string
	// Labels become ISTIO_METAJSON_LABELS, the node's LABELS metadata. Default: none.
	Labels map[string]string
	// Metadata entries become ISTIO_META_<KEY> variables, node metadata KEY
	// (keys as given, e.g. "WORKLOAD_NAME"). Default: none.
	Metadata map[string]string
	// XDSHeaders entries become XDS_HEADER_<NAME> variables: static headers on
	// every upstream xDS stream. Default: none.
	XDSHeaders map[string]string

	// ProxyConfig is merged over Istio's defaults and passed as PROXY_CONFIG.
	// Empty DiscoveryAddress defaults to Options.DiscoveryAddress; zero
	// StatusPort to a free port. ControlPlaneAuthPolicy is always passed, so its
	// zero value NONE (a plaintext upstream) applies, not Istio's MUTUAL_TLS
	// default. Default: an empty ProxyConfig.
	ProxyConfig *meshconfig.ProxyConfig
	// XDSRootCA is the PEM root pilot-agent verifies the discovery server with
	// when ControlPlaneAuthPolicy is MUTUAL_TLS (written to a file named by
	// XDS_ROOT_CA). Required for MUTUAL_TLS unless Env sets XDS_ROOT_CA.
	XDSRootCA []byte
	// IstiodSAN (ISTIOD_SAN) overrides the server name verified with
	// MUTUAL_TLS. Default: the host of the discovery address.
	IstiodSAN string

	// CAAddress (CA_ADDR) is where pilot-agent asks for its workload
	// certificate (istio.v1.auth.IstioCertificateService, over TLS).
	// Default: the discovery address, as on a VM whose bootstrap names no
	// CA_ADDR (Embark relays istiod's CA there).
	CAAddress string
	// CARootCA is the PEM root pilot-agent verifies its CA with (written to a
	// file named by CA_ROOT_CA). Default: XDSRootCA, as Embark's bootstrap
	// names one root file for both. Required (unless Env sets CA_ROOT_CA or
	// NoCA is set): pilot-agent exits without a root for its CA.
	CARootCA []byte
	// NoCA points pilot-agent's CA at a loopback port nothing listens on:
	// it keeps retrying its workload certificate in the background, and its
	// xDS proxy, which never waits for certificates, works regardless. Only
	// for tests of pilot-agent's xDS path against an xDS server that is not
	// Embark (test/istioagent's own): tests of Embark get real certificates
	// from a real istiod's CA. Nothing serves or fakes a certificate.
	NoCA bool

	// EnvoyStandIn runs pilot-agent with Envoy enabled (DISABLE_ENVOY unset)
	// and a stand-in for Envoy's binary, a shell script that does nothing
	// until pilot-agent stops it (there is no Envoy binary here): pilot-agent
	// then serves its SDS socket (Agent.SDSSocket) as to Envoy, which it does
	// not without Envoy. Its readiness (/healthz/ready) never passes, as
	// Envoy's admin port never answers. Default: DISABLE_ENVOY=true.
	EnvoyStandIn bool

	// Token is written to ./var/run/secrets/tokens/istio-token before the agent
	// starts; pilot-agent sends it as "authorization: Bearer <token>". Default:
	// no token file, no authorization header. See Agent.SetToken.
	Token string

	// ResolvConf, when set, is the /etc/resolv.conf pilot-agent reads (its
	// DNS proxy forwards the names it does not know to those servers; the
	// path is fixed in pilot-agent). pilot-agent then runs in a mount
	// namespace of its own (unshare(1), as root or with a user namespace)
	// where this content is bind-mounted over /etc/resolv.conf; the host's
	// file is untouched. Default: the host's /etc/resolv.conf.
	ResolvConf []byte

	// Env adds environment variables, or overrides those Start sets (for
	// example CA_ADDR or FILE_MOUNTED_CERTS). Default: none.
	Env map[string]string
	// LogLevel is pilot-agent's --log_output_level. Default: "default:info".
	LogLevel string
	// BinDir holds the pilot-agent binary. Default: $KUBEBUILDER_ASSETS, else
	// bin/testenv in the repository root.
	BinDir string
	// WorkDir is pilot-agent's working directory, the root of every relative
	// path it uses (./etc/istio/config/mesh, ./var/run/secrets/tokens/...),
	// like a VM's / where the onboarding agent writes the sidecar's files.
	// It is created when missing and kept at the end. Default: a new
	// temporary directory, removed at the end.
	WorkDir string
	// StartTimeout bounds the wait for pilot-agent's XDS socket. Default: 60s.
	StartTimeout time.Duration
	// StopTimeout bounds the graceful stop (SIGTERM) before SIGKILL. Default: 30s.
	StopTimeout time.Duration
}

func (o *Options) setDefaults() {
	if o.PodName == "" {
		o.PodName = "vm-1"
	}
	if o.PodNamespace == "" {
		o.PodNamespace = "default"
	}
	if o.InstanceIP == "" {
		o.InstanceIP = "127.0.0.1"
	}
	if o.ClusterID == "" {
		o.ClusterID = "Kubernetes"
	}
	if o.LogLevel == "" {
		o.LogLevel = "default:info"
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 60 * time.Second
	}
	if o.StopTimeout == 0 {
		o.StopTimeout = 30 * time.Second
	}
}

// Agent is a pilot-agent process running as a VM sidecar without Envoy, in a
// working directory of its own. Its methods that take no context must be called
// from the test's goroutine (they may fail the test).
type Agent struct {
	t       testing.TB
	opts    Options
	bin     string
	workDir string
	env     []string
	logs    *logBuffer
	status  int

	mu   sync.Mutex
	proc *process
	runs int
}

// process is one run of pilot-agent.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // cmd.Wait's result, set before done is closed
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Start starts pilot-agent as `pilot-agent proxy sidecar` with DISABLE_ENVOY=true
// and waits until its XDS socket is listening. The agent is stopped, and its
// working directory removed, when the test ends; its logs are written to the
// test log when the test failed.
func Start(t testing.TB, opts Options) *Agent {
	t.Helper()
	opts.setDefaults()
	bin, err := BinaryPath("pilot-agent", opts.BinDir)
	if err != nil {
		t.Fatalf("istioagent: %v", err)
	}
	// Not t.TempDir(): a unix socket path is limited to 107 bytes, and a
	// t.TempDir() path alone takes up to 83 under /tmp (test names are cut at
	// 64), leaving no room for etc/istio/proxy/XDS under a longer TMPDIR.
	workDir := opts.WorkDir
	if workDir != "" {
		if err := os.MkdirAll(workDir, 0o755); err != nil {
			t.Fatalf("istioagent: create working directory: %v", err)
		}
	} else {
		if workDir, err = os.MkdirTemp("", "istioagent-"); err != nil {
			t.Fatalf("istioagent: create working directory: %v", err)
		}
		t.Cleanup(func() {
			if err := os.RemoveAll(workDir); err != nil {
				t.Errorf("istioagent: remove working directory: %v", err)
			}
		})
	}

	a := &Agent{t: t, opts: opts, bin: bin, workDir: workDir, logs: &logBuffer{}}
	if err := a.prepare(); err != nil {
		t.Fatalf("istioagent: %v", err)
	}
	t.Cleanup(a.cleanup)
	if err := a.start(); err != nil {
		t.Fatalf("istioagent: %v", err) // cleanup shows the logs
	}
	return a
}

// prepare writes the files pilot-agent reads and computes its environment.
func (a *Agent) prepare() error {
	o := a.opts
	pc := &meshconfig.ProxyConfig{}
	if o.ProxyConfig != nil {
		pc = proto.Clone(o.ProxyConfig).(*meshconfig.ProxyConfig)
	}
	if pc.DiscoveryAddress == "" {
		pc.DiscoveryAddress = o.DiscoveryAddress
	}
	if pc.DiscoveryAddress == "" {
		return errors.New("no discovery address: set Options.DiscoveryAddress")
	}
	if o.EnvoyStandIn {
		standIn := filepath.Join(a.workDir, envoyStandInPath)
		if err := writeFile(standIn, []byte(envoyStandInScript), 0o755); err != nil {
			return err
		}
		config := filepath.Join(a.workDir, envoyStandInConfig)
		if err := writeFile(config, []byte("{}\n"), 0o644); err != nil {
			return err
		}
		// Envoy's bootstrap is not generated: nothing reads it.
		pc.BinaryPath, pc.CustomConfigFile = standIn, config
		if pc.TerminationDrainDuration == nil {
			// Nothing to drain: stop at once (Istio waits 5s by default).
			pc.TerminationDrainDuration = durationpb.New(0)
		}
	}
	if pc.StatusPort == 0 {
		port, err := freePort()
		if err != nil {
			return err
		}
		pc.StatusPort = int32(port)
	}
	a.status = int(pc.StatusPort)
	proxyConfig, err := proxyConfigJSON(pc)
	if err != nil {
		return err
	}

	env := map[string]string{
		"PATH":          os.Getenv("PATH"),
		"HOME":          a.workDir,
		"DISABLE_ENVOY": strconv.FormatBool(!o.EnvoyStandIn),
		// Without Envoy pilot-agent serves no SDS socket; it writes the
		// certificates it would serve (`default`, `ROOTCA`) here.
		"OUTPUT_CERTS":          filepath.Join(a.workDir, outputCertsPath),
		"CLOUD_PLATFORM":        "none",
		"POD_NAME":              o.PodName,
		"POD_NAMESPACE":         o.PodNamespace,
		"INSTANCE_IP":           o.InstanceIP,
		"ISTIO_META_CLUSTER_ID": o.ClusterID,
		"PROXY_CONFIG":          proxyConfig,
	}
	if o.ServiceAccount != "" {
		env["SERVICE_ACCOUNT"] = o.ServiceAccount
	}
	if len(o.Labels) > 0 {
		labels, err := json.Marshal(o.Labels)
		if err != nil {
			return fmt.Errorf("encode labels: %w", err)
		}
		env["ISTIO_METAJSON_LABELS"] = string(labels)
	}
	for k, v := range o.Metadata {
		env["ISTIO_META_"+k] = v
	}
	for k, v := range o.XDSHeaders {
		env["XDS_HEADER_"+k] = v
	}
	if o.IstiodSAN != "" {
		env["ISTIOD_SAN"] = o.IstiodSAN
	}
	if o.ResolvConf != nil {
		if err := writeFile(filepath.Join(a.workDir, resolvConfPath), o.ResolvConf, 0o644); err != nil {
			return err
		}
	}
	if len(o.XDSRootCA) > 0 {
		if err := writeFile(filepath.Join(a.workDir, xdsRootCAPath), o.XDSRootCA, 0o644); err != nil {
			return err
		}
		env["XDS_ROOT_CA"] = "./" + xdsRootCAPath
	}
	switch {
	case o.NoCA:
		port, err := closedPort()
		if err != nil {
			return err
		}
		env["CA_ADDR"] = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		root, err := selfSignedRootPEM()
		if err != nil {
			return err
		}
		if err := writeFile(filepath.Join(a.workDir, caRootCAPath), root, 0o644); err != nil {
			return err
		}
		env["CA_ROOT_CA"] = "./" + caRootCAPath
	default:
		if o.CAAddress != "" {
			env["CA_ADDR"] = o.CAAddress
		}
		root := o.CARootCA
		if len(root) == 0 {
			root = o.XDSRootCA
		}
		if len(root) > 0 {
			if err := writeFile(filepath.Join(a.workDir, caRootCAPath), root, 0o644); err != nil {
				return err
			}
			env["CA_ROOT_CA"] = "./" + caRootCAPath
		}
	}
	for k, v := range o.Env {
		env[k] = v
	}
	if out := env["OUTPUT_CERTS"]; out != "" {
		// pilot-agent writes into it but does not create it.
		if !filepath.IsAbs(out) {
			out = filepath.Join(a.workDir, out)
		}
		if err := os.MkdirAll(out, 0o755); err != nil {
			return fmt.Errorf("create OUTPUT_CERTS: %w", err)
		}
	}
	if env["CA_ROOT_CA"] == "" {
		return errors.New("no root for pilot-agent's CA: set Options.CARootCA or XDSRootCA (or NoCA for tests of the xDS path alone)")
	}
	if pc.ControlPlaneAuthPolicy == meshconfig.AuthenticationPolicy_MUTUAL_TLS && env["XDS_ROOT_CA"] == "" {
		// Otherwise pilot-agent would verify the server with the self-signed
		// root written below.
		return errors.New("controlPlaneAuthPolicy MUTUAL_TLS needs Options.XDSRootCA")
	}
	a.env = make([]string, 0, len(env))
	for k, v := range env {
		a.env = append(a.env, k+"="+v)
	}
	sort.Strings(a.env)

	if o.Token != "" {
		if err := a.writeToken(o.Token); err != nil {
			return err
		}
	}
	return nil
}

// proxyConfigJSON encodes pc for PROXY_CONFIG, which pilot-agent merges over
// its defaults. protojson leaves out zero values, which would keep Istio's
// defaults, so the auth policy is always written.
func proxyConfigJSON(pc *meshconfig.ProxyConfig) (string, error) {
	b, err := protojson.Marshal(pc)
	if err != nil {
		return "", fmt.Errorf("encode proxy config: %w", err)
	}
	m := map[string]any{}
	if err := json.Unmarshal(b, &m); err != nil {
		return "", fmt.Errorf("decode proxy config: %w", err)
	}
	m["controlPlaneAuthPolicy"] = pc.ControlPlaneAuthPolicy.String()
	b, err = json.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("encode proxy config: %w", err)
	}
	return string(b), nil
}

// start runs pilot-agent once and waits for its XDS socket.
func (a *Agent) start() error {
	// A fresh bootstrap file tells that this run is up.
	if err := os.Remove(a.GRPCBootstrapPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale gRPC bootstrap: %w", err)
	}
	a.mu.Lock()
	a.runs++
	fmt.Fprintf(a.logs, "=== istioagent: start #%d: %s proxy sidecar\n", a.runs, a.bin)
	a.mu.Unlock()

	cmd := exec.Command(a.bin, "proxy", "sidecar", "--log_output_level="+a.opts.LogLevel)
	if a.opts.ResolvConf != nil {
		cmd = withResolvConf(cmd, filepath.Join(a.workDir, resolvConfPath))
	}
	cmd.Dir = a.workDir
	cmd.Env = a.env
	cmd.Stdout = a.logs
	cmd.Stderr = a.logs
	setProcAttr(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start pilot-agent: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	a.mu.Lock()
	a.proc = p
	a.mu.Unlock()

	deadline := time.NewTimer(a.opts.StartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if a.ready() {
			return nil
		}
		select {
		case <-p.done:
			a.forget(p)
			return fmt.Errorf("pilot-agent exited before its XDS socket was ready: %w", p.err)
		case <-deadline.C:
			a.forget(p)
			a.stopProcess(p)
			return fmt.Errorf("pilot-agent's XDS socket %s not ready after %v", a.XDSSocket(), a.opts.StartTimeout)
		case <-tick.C:
		}
	}
}

// forget drops p as the current run.
func (a *Agent) forget(p *process) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proc == p {
		a.proc = nil
	}
}

// ready reports whether pilot-agent listens on its XDS socket and has written
// its gRPC bootstrap (which it does right after starting the xDS proxy).
func (a *Agent) ready() bool {
	fi, err := os.Stat(a.XDSSocket())
	if err != nil || fi.Mode()&fs.ModeSocket == 0 {
		return false
	}
	_, err = os.Stat(a.GRPCBootstrapPath())
	return err == nil
}

// Stop stops pilot-agent gracefully (SIGTERM, then SIGKILL after
// Options.StopTimeout) and waits for it to exit. It fails the test when the
// agent had already exited on its own. Stopping a stopped agent does nothing.
func (a *Agent) Stop() {
	a.t.Helper()
	a.mu.Lock()
	p := a.proc
	a.proc = nil
	a.mu.Unlock()
	if p == nil {
		return
	}
	if p.exited() {
		a.t.Errorf("istioagent: pilot-agent exited unexpectedly: %v", p.err)
		return
	}
	a.stopProcess(p)
}

// stopProcess sends SIGTERM, then SIGKILL, and waits for the exit.
func (a *Agent) stopProcess(p *process) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(a.opts.StopTimeout)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		fmt.Fprintf(a.logs, "=== istioagent: no exit %v after SIGTERM, killing\n", a.opts.StopTimeout)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	fmt.Fprintf(a.logs, "=== istioagent: exited: %v\n", p.err)
}

// Restart stops pilot-agent and starts it again in the same working directory,
// with the same environment and the current token file.
func (a *Agent) Restart() {
	a.t.Helper()
	a.Stop()
	if err := a.start(); err != nil {
		a.t.Fatalf("istioagent: restart: %v", err) // cleanup shows the logs
	}
}

// Running reports whether the pilot-agent process is alive.
func (a *Agent) Running() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.proc != nil && !a.proc.exited()
}

// cleanup stops the agent at the end of the test and shows its logs when the
// test failed.
func (a *Agent) cleanup() {
	a.Stop()
	if a.t.Failed() {
		a.t.Logf("pilot-agent logs (%s):\n%s", a.workDir, a.Logs())
	}
}

// SetToken replaces the token file pilot-agent reads for every new upstream
// stream (atomically, as kubelet rotates projected tokens). An empty token
// removes the file: pilot-agent then sends no authorization header.
func (a *Agent) SetToken(token string) {
	a.t.Helper()
	if token == "" {
		if err := os.Remove(filepath.Join(a.workDir, tokenPath)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			a.t.Fatalf("istioagent: remove token: %v", err)
		}
		return
	}
	if err := a.writeToken(token); err != nil {
		a.t.Fatalf("istioagent: %v", err)
	}
}

func (a *Agent) writeToken(token string) error {
	return writeFile(filepath.Join(a.workDir, tokenPath), []byte(token), 0o600)
}

// WaitCertificates waits until pilot-agent has its workload certificate
// from its CA and returns the PEM chain (what it serves over SDS as
// `default`) and root (`ROOTCA`), as it writes them to OUTPUT_CERTS
// (./etc/istio/output-certs unless Env overrides it).
func (a *Agent) WaitCertificates(timeout time.Duration) (chain, root []byte, err error) {
	dir := filepath.Join(a.workDir, outputCertsPath)
	for _, kv := range a.env {
		if v, ok := strings.CutPrefix(kv, "OUTPUT_CERTS="); ok {
			dir = v
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		chain, err = os.ReadFile(filepath.Join(dir, "cert-chain.pem"))
		if err == nil {
			if root, err = os.ReadFile(filepath.Join(dir, "root-cert.pem")); err == nil && len(chain) > 0 && len(root) > 0 {
				return chain, root, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("pilot-agent got no workload certificate within %v (%v)", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// SDSSocket is the absolute path of the unix socket where pilot-agent serves
// SDS (`default`, `ROOTCA`) to Envoy: with Options.EnvoyStandIn only.
func (a *Agent) SDSSocket() string { return filepath.Join(a.workDir, sdsSocketPath) }

// WorkDir is the agent's working directory, the root of every relative path
// pilot-agent uses.
func (a *Agent) WorkDir() string { return a.workDir }

// XDSSocket is the absolute path of the agent's xDS proxy unix socket
// (./etc/istio/proxy/XDS in its working directory).
func (a *Agent) XDSSocket() string { return filepath.Join(a.workDir, xdsSocketPath) }

// GRPCBootstrapPath is the gRPC xDS bootstrap pilot-agent writes for proxyless
// gRPC clients. Its node is what Connect sends; its server_uri is not usable
// as is (pilot-agent writes unix:///etc/istio/proxy/XDS, an absolute path).
func (a *Agent) GRPCBootstrapPath() string { return filepath.Join(a.workDir, grpcBootstrapPath) }

// StatusPort is the port of pilot-agent's status server (/healthz/ready,
// /stats/prometheus). It was free when the agent was configured.
func (a *Agent) StatusPort() int { return a.status }

// Options returns the options the agent was started with, defaults filled in.
func (a *Agent) Options() Options { return a.opts }

// Logs returns everything pilot-agent has written so far, over all its runs.
func (a *Agent) Logs() string { return a.logs.String() }

// Node returns the node pilot-agent generated for its clients (from its gRPC
// bootstrap): the ID sidecar~<INSTANCE_IP>~<POD_NAME>.<POD_NAMESPACE>~<POD_NAMESPACE>.svc.cluster.local
// and metadata such as PROXY_CONFIG, ISTIO_VERSION, CLUSTER_ID and LABELS.
func (a *Agent) Node() (*corev3.Node, error) {
	return NodeFromGRPCBootstrap(a.GRPCBootstrapPath())
}

// NodeFromGRPCBootstrap reads the node of the gRPC xDS bootstrap pilot-agent
// wrote at path.
func NodeFromGRPCBootstrap(path string) (*corev3.Node, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read pilot-agent's gRPC bootstrap: %w", err)
	}
	var bootstrap struct {
		Node json.RawMessage `json:"node"`
	}
	if err := json.Unmarshal(b, &bootstrap); err != nil {
		return nil, fmt.Errorf("decode pilot-agent's gRPC bootstrap: %w", err)
	}
	node := &corev3.Node{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(bootstrap.Node, node); err != nil {
		return nil, fmt.Errorf("decode node of pilot-agent's gRPC bootstrap: %w", err)
	}
	return node, nil
}

// writeFile writes a file atomically, creating its directory.
func writeFile(path string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create directory for %s: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// closedPort returns a loopback port nothing listened on a moment ago.
func closedPort() (int, error) { return freeport.Port() }

// freePort returns a TCP port free now (see package freeport).
func freePort() (int, error) { return freeport.Port() }

// logBuffer collects a process's output; it is written from exec's copying
// goroutines and read from the test.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
