// Package vmsim is the one simulation of a VM's parts besides its
// onboarding agent that the end-to-end tests (test/rollout), the demo
// (test/demo) and the agent's integration tests share:
//
//   - the paths the onboarding agent writes the sidecar's files to, inside
//     a VM's root directory (ClusterEnv, MeshConfig, RootCert, Token) and
//     the sidecar unit's socket (UnitSocket);
//   - the VM's application, an HTTP server whose /ready answers as told
//     (App), which the WorkloadGroup's readiness probe checks;
//   - the istio-sidecar systemd unit (Unit): the agent's restart and stop
//     commands reach it over a unix socket through a stand-in systemctl
//     (Systemctl), and it runs them one at a time, as systemd does;
//   - reading the ProxyConfig of the mesh config the agent wrote
//     (ProxyConfig), and all the files it wrote for the sidecar, as the
//     options to start pilot-agent with (SidecarOptions; each VM's DNS
//     proxy on a loopback port of its own);
//   - a log sink read while it is written (SyncBuffer).
//
// The IMDS and STS of a simulated EC2 instance are awstest's; pilot-agent
// is test/istioagent's.
package vmsim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	meshconfig "istio.io/api/mesh/v1alpha1"
	"sigs.k8s.io/yaml"
)

// Paths inside a VM's root directory, as on a VM (the onboarding agent's
// defaults); pilot-agent runs with the root as its working directory, so it
// finds the token where the agent writes it.
const (
	ClusterEnv = "var/lib/istio/envoy/cluster.env"
	MeshConfig = "etc/istio/config/mesh"
	RootCert   = "etc/istio/xds-root-cert.pem"
	Token      = "var/run/secrets/tokens/istio-token"
	UnitSocket = "run/istio-sidecar.sock"
)

// App is a VM's application: an HTTP server on the VM's address whose
// /ready answers 200 while it is healthy and 503 otherwise, and whose other
// paths answer "<greeting>".
type App struct {
	// Addr is the address it listens on.
	Addr    string
	srv     *http.Server
	healthy atomic.Bool
}

// StartApp starts a healthy application on ip:port.
func StartApp(ip string, port int, greeting string) (*App, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("listen for the application: %w", err)
	}
	a := &App{Addr: l.Addr().String()}
	a.healthy.Store(true)
	mux := http.NewServeMux()
	mux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		if !a.healthy.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, greeting) })
	a.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = a.srv.Serve(l) }()
	return a, nil
}

// SetHealthy sets what /ready answers.
func (a *App) SetHealthy(ok bool) { a.healthy.Store(ok) }

// Healthy reports what /ready answers.
func (a *App) Healthy() bool { return a.healthy.Load() }

// Close stops the application.
func (a *App) Close() { _ = a.srv.Close() }

// Fatal is a panic value a unit command may raise to fail (test helpers
// that take a testing.TB do, through FatalTB or the demo's TB): the unit
// recovers it and answers the command with it as the error.
type Fatal string

// FatalTB lets helpers that fail their testing.TB (test/istioagent's) run
// in a unit command's goroutine: Fatal and Fatalf fail the command (they
// panic with Fatal, which the unit recovers), not the goroutine.
type FatalTB struct{ testing.TB }

// Fatalf fails the unit command: it panics with Fatal.
func (f FatalTB) Fatalf(format string, args ...any) { panic(Fatal(fmt.Sprintf(format, args...))) }

// Fatal fails the unit command: it panics with Fatal.
func (f FatalTB) Fatal(args ...any) { panic(Fatal(fmt.Sprint(args...))) }

// Unit plays systemd for a VM's istio-sidecar unit.
type Unit struct {
	l       net.Listener
	restart func() error
	stop    func() error

	mu sync.Mutex // one command at a time, as systemd does per unit
	wg sync.WaitGroup
}

// StartUnit serves the unit on the unix socket path; restart and stop run
// the unit's commands.
func StartUnit(socket string, restart, stop func() error) (*Unit, error) {
	l, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("serve the sidecar unit: %w", err)
	}
	u := &Unit{l: l, restart: restart, stop: stop}
	u.wg.Add(1)
	go u.serve()
	return u, nil
}

func (u *Unit) serve() {
	defer u.wg.Done()
	for {
		c, err := u.l.Accept()
		if err != nil {
			return
		}
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			defer c.Close()
			verb, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return
			}
			if err := u.do(strings.TrimSpace(verb)); err != nil {
				fmt.Fprintf(c, "error: %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
				return
			}
			fmt.Fprintln(c, "ok")
		}()
	}
}

// do runs one command; a Fatal panic fails the command, not the process.
func (u *Unit) do(verb string) (err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(Fatal)
			if !ok {
				panic(r)
			}
			err = errors.New(string(f))
		}
	}()
	switch verb {
	case "restart":
		return u.restart()
	case "stop":
		return u.stop()
	default:
		return fmt.Errorf("unknown command %q (restart, stop)", verb)
	}
}

// Close stops serving and waits for the commands in progress.
func (u *Unit) Close() {
	_ = u.l.Close()
	u.wg.Wait()
}

// Systemctl is the client side: it asks the unit listening on socket to
// run verb and waits for its answer, as `systemctl restart istio-sidecar`
// waits for the unit. A binary that plays systemctl calls it from main.
func Systemctl(socket, verb string) error {
	c, err := net.DialTimeout("unix", socket, 5*time.Second)
	if err != nil {
		return fmt.Errorf("systemctl: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	if _, err := fmt.Fprintln(c, verb); err != nil {
		return fmt.Errorf("systemctl %s: %w", verb, err)
	}
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("systemctl %s: no reply: %w", verb, err)
	}
	if reply = strings.TrimSpace(reply); reply != "ok" {
		return fmt.Errorf("systemctl %s: %s", verb, reply)
	}
	return nil
}

// ProxyConfig reads the ProxyConfig (defaultConfig) of the mesh config the
// onboarding agent wrote; a field this Istio does not know is an error.
func ProxyConfig(meshConfig []byte) (*meshconfig.ProxyConfig, error) {
	j, err := yaml.YAMLToJSON(meshConfig)
	if err != nil {
		return nil, fmt.Errorf("mesh config: %w", err)
	}
	var mesh struct {
		DefaultConfig json.RawMessage `json:"defaultConfig"`
	}
	if err := json.Unmarshal(j, &mesh); err != nil {
		return nil, fmt.Errorf("mesh config: %w", err)
	}
	pc := &meshconfig.ProxyConfig{}
	if len(mesh.DefaultConfig) == 0 || string(mesh.DefaultConfig) == "null" {
		return pc, nil
	}
	if err := protojson.Unmarshal(mesh.DefaultConfig, pc); err != nil {
		return nil, fmt.Errorf("mesh config defaultConfig: %w", err)
	}
	return pc, nil
}

// SyncBuffer is a log sink read while it is written.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
