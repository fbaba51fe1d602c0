package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	meshconfig "istio.io/api/mesh/v1alpha1"
	"sigs.k8s.io/yaml"
)

// sidecarUnit plays systemd for a simulated VM's istio-sidecar unit: the
// onboarding agent's restart and stop commands (`demo systemctl --socket
// S restart|stop`, the demo binary run as a command) reach it over a unix
// socket in the VM's directory, and it runs the given functions.
type sidecarUnit struct {
	l       net.Listener
	restart func() error
	stop    func() error

	mu sync.Mutex // one command at a time, as systemd does per unit
	wg sync.WaitGroup
}

// systemctlArg is the first argument that runs the demo binary as the
// simulated VM's systemctl.
const systemctlArg = "systemctl"

// startSidecarUnit serves the unit on socket.
func startSidecarUnit(socket string, restart, stop func() error) (*sidecarUnit, error) {
	l, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("serve the sidecar unit: %w", err)
	}
	u := &sidecarUnit{l: l, restart: restart, stop: stop}
	u.wg.Add(1)
	go u.serve()
	return u, nil
}

func (u *sidecarUnit) serve() {
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
			err = u.do(strings.TrimSpace(verb))
			if err != nil {
				fmt.Fprintf(c, "error: %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
				return
			}
			fmt.Fprintln(c, "ok")
		}()
	}
}

// do runs one command; a fatal error of the reused test helpers fails the
// command, not the demo.
func (u *sidecarUnit) do(verb string) (err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(fatal)
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

// close stops serving and waits for commands in progress.
func (u *sidecarUnit) close() {
	_ = u.l.Close()
	u.wg.Wait()
}

// systemctl is the demo binary run as `demo systemctl --socket S VERB`: it
// asks the VM's sidecar unit to run VERB and exits non-zero when it failed.
func systemctl(args []string) int {
	if len(args) != 3 || args[0] != "--socket" {
		fmt.Fprintln(os.Stderr, "usage: demo systemctl --socket SOCKET restart|stop")
		return 2
	}
	c, err := net.DialTimeout("unix", args[1], 5*time.Second)
	if err != nil {
		fmt.Fprintf(os.Stderr, "systemctl: %v\n", err)
		return 1
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	if _, err := fmt.Fprintln(c, args[2]); err != nil {
		fmt.Fprintf(os.Stderr, "systemctl: %v\n", err)
		return 1
	}
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		fmt.Fprintf(os.Stderr, "systemctl: no reply: %v\n", err)
		return 1
	}
	if reply = strings.TrimSpace(reply); reply != "ok" {
		fmt.Fprintf(os.Stderr, "systemctl %s: %s\n", args[2], reply)
		return 1
	}
	return 0
}

// parseClusterEnv reads cluster.env as systemd's EnvironmentFile= does for
// the lines the onboarding agent writes: comments, blank lines and
// KEY='value' with '\” for a quote (or an unquoted value).
func parseClusterEnv(data []byte) (map[string]string, error) {
	env := map[string]string{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t'\"") {
			return nil, fmt.Errorf("cluster.env line %d: want KEY=value, got %q", i+1, line)
		}
		if strings.HasPrefix(v, "'") {
			var b strings.Builder
			rest := v
			for {
				if !strings.HasPrefix(rest, "'") {
					return nil, fmt.Errorf("cluster.env line %d: bad quoting in %q", i+1, v)
				}
				end := strings.IndexByte(rest[1:], '\'')
				if end < 0 {
					return nil, fmt.Errorf("cluster.env line %d: unterminated quote in %q", i+1, v)
				}
				b.WriteString(rest[1 : 1+end])
				rest = rest[2+end:]
				if rest == "" {
					break
				}
				if !strings.HasPrefix(rest, `\'`) {
					return nil, fmt.Errorf("cluster.env line %d: bad quoting in %q", i+1, v)
				}
				b.WriteByte('\'')
				rest = rest[2:]
			}
			v = b.String()
		}
		env[k] = v
	}
	return env, nil
}

// parseMeshConfig reads the ProxyConfig (defaultConfig) of the mesh config
// file the onboarding agent writes.
func parseMeshConfig(data []byte) (*meshconfig.ProxyConfig, error) {
	j, err := yaml.YAMLToJSON(data)
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
