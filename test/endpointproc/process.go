package endpointproc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/freeport"
	"github.com/embark-mesh/embark/test/testenv"
)

// Build compiles cmd/onboarding-endpoint into dir and returns the binary.
func Build(ctx context.Context, dir string) (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "onboarding-endpoint")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/onboarding-endpoint")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/onboarding-endpoint: %w: %s", err, out)
	}
	return bin, nil
}

// FreeAddr returns a free loopback address.
func FreeAddr() (string, error) { return freeport.Addr() }

// Cluster describes the endpoint deployment shared by replicas: the
// namespace it runs in (leases, token keys) and the AWS CA it trusts.
type Cluster struct {
	Binary     string
	Kubeconfig string
	Namespace  string
	// CA signs the simulated instances' identity documents.
	CA *awstest.CA
	// GracePeriod before a disconnected workload is removed (default 10m,
	// longer than any fault test).
	GracePeriod time.Duration
	// Dir holds configuration files and logs.
	Dir string
	// Pprof makes each replica serve Go profiles on a loopback address
	// (Replica.Pprof, the endpoint's -pprof flag).
	Pprof bool
	// EventCacheSize is the endpoint's -event-cache-size (0: its default).
	EventCacheSize int
	// Configure, when set, changes each replica's configuration beyond the
	// cluster's own settings (e.g. its limits).
	Configure func(*config.Configuration)
}

// Replica is one endpoint process.
type Replica struct {
	Name                     string
	Onboarding, XDS, Metrics string
	// Pprof is the address of the replica's /debug/pprof/ (Cluster.Pprof).
	Pprof       string
	cluster     *Cluster
	config, log string
	mu          sync.Mutex
	cmd         *exec.Cmd
	done        chan struct{}
	waitErr     error
}

// NewReplica allocates addresses and writes the configuration of a replica.
func (c *Cluster) NewReplica(name string) (*Replica, error) {
	r := &Replica{Name: name, cluster: c}
	var err error
	for _, a := range []*string{&r.Onboarding, &r.XDS, &r.Metrics} {
		addr, err := FreeAddr()
		if err != nil {
			return nil, err
		}
		*a = addr
	}
	if c.Pprof {
		if r.Pprof, err = FreeAddr(); err != nil {
			return nil, err
		}
	}
	certs := filepath.Join(c.Dir, "aws-certs")
	if err := os.MkdirAll(certs, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(certs, "us-east-2.pem"), c.CA.CertificatePEM(), 0o644); err != nil {
		return nil, err
	}
	grace := c.GracePeriod
	if grace == 0 {
		grace = 10 * time.Minute
	}
	cfg := configkit.Config(c.Namespace)
	cfg.Endpoint.Hosts = []string{Audience}
	cfg.Identity.AWS.CertificatesDir = certs
	cfg.Registration.GracePeriod = configkit.Duration(grace)
	cfg.Listen = config.Listen{Onboarding: r.Onboarding, Metrics: r.Metrics, XDS: r.XDS}
	if c.Configure != nil {
		c.Configure(cfg)
	}
	data, err := configkit.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	r.config = filepath.Join(c.Dir, name+".yaml")
	r.log = filepath.Join(c.Dir, name+".log")
	if err := os.WriteFile(r.config, data, 0o600); err != nil {
		return nil, err
	}
	return r, nil
}

// Audience is the audience of the replicas' credentials.
const Audience = "onboarding-endpoint.faults.test"

// Start starts the process and waits until it is ready (/readyz).
func (r *Replica) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		return fmt.Errorf("replica %s already running", r.Name)
	}
	logf, err := os.OpenFile(r.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	args := []string{"-config", r.config, "-kubeconfig", r.cluster.Kubeconfig, "-replica", r.Name, "-debug-xds", "off"}
	if r.Pprof != "" {
		args = append(args, "-pprof", r.Pprof)
	}
	if r.cluster.EventCacheSize > 0 {
		args = append(args, "-event-cache-size", strconv.Itoa(r.cluster.EventCacheSize))
	}
	cmd := exec.Command(r.cluster.Binary, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("start replica %s: %w", r.Name, err)
	}
	r.cmd, r.done = cmd, make(chan struct{})
	go func(done chan struct{}) {
		err := cmd.Wait()
		_ = logf.Close()
		r.mu.Lock()
		r.waitErr = err
		r.mu.Unlock()
		close(done)
	}(r.done)
	done := r.done
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := http.Get("http://" + r.Metrics + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-done:
			r.cmd = nil
			return fmt.Errorf("replica %s exited before it was ready: %v; log %s:\n%s", r.Name, r.waitErr, r.log, r.tail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replica %s not ready after 2m; log:\n%s", r.Name, r.tail())
		}
	}
}

// Stop sends SIGTERM (graceful: streams closed, disconnects stored) and
// waits for the process to exit.
func (r *Replica) Stop() error { return r.signal(syscall.SIGTERM) }

// Kill sends SIGKILL: nothing is flushed.
func (r *Replica) Kill() error { return r.signal(syscall.SIGKILL) }

func (r *Replica) signal(sig syscall.Signal) error {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal replica %s: %w", r.Name, err)
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("replica %s did not exit within 1m of %v", r.Name, sig)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cmd = nil
	var exit *exec.ExitError
	if r.waitErr != nil && sig == syscall.SIGTERM && !errors.As(r.waitErr, &exit) {
		return r.waitErr
	}
	if sig == syscall.SIGTERM && r.waitErr != nil {
		return fmt.Errorf("replica %s exited with %v after SIGTERM; log:\n%s", r.Name, r.waitErr, r.tail())
	}
	return nil
}

// Cleanup stops the process if it still runs (for t.Cleanup).
func (r *Replica) Cleanup() { _ = r.Kill() }

// tail returns the end of the replica's log.
func (r *Replica) tail() string {
	data, _ := os.ReadFile(r.log)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}

// LogTail returns the last 4000 bytes of the replica's log.
func (r *Replica) LogTail() string { return r.tail() }

// LogContains reports whether the replica's log contains s.
func (r *Replica) LogContains(s string) bool {
	data, _ := os.ReadFile(r.log)
	return strings.Contains(string(data), s)
}

// Scrape returns the unlabelled gauges and counters of the replica's
// /metrics whose names are given, e.g. go_goroutines.
func (r *Replica) Scrape(names ...string) (map[string]float64, error) {
	resp, err := http.Get("http://" + r.Metrics + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return parseMetrics(resp.Body, names)
}

func parseMetrics(body io.Reader, names []string) (map[string]float64, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 || !want[f[0]] {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return nil, fmt.Errorf("metric %s: %w", f[0], err)
		}
		out[f[0]] = v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("metric %s missing", n)
		}
	}
	return out, nil
}

// HeapProfile writes the replica's heap profile, taken after a garbage
// collection, to path (Cluster.Pprof must be set). Compare two with
// `go tool pprof -base first second`.
func (r *Replica) HeapProfile(path string) error {
	if r.Pprof == "" {
		return fmt.Errorf("replica %s serves no profiles (Cluster.Pprof)", r.Name)
	}
	resp, err := http.Get("http://" + r.Pprof + "/debug/pprof/heap?gc=1")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("heap profile of %s: %s", r.Name, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// Register makes t clean the replica up.
func (r *Replica) Register(t testing.TB) { t.Cleanup(r.Cleanup) }
