//go:build install

package install

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// container is a container run by runc, its output kept.
type container struct {
	ID   string
	runc string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

// Log is the container's output so far.
func (c *container) Log() string { return c.out.String() }

// Exited reports whether the process has ended, and how.
func (c *container) Exited() (bool, error) {
	select {
	case <-c.done:
		return true, c.err
	default:
		return false, nil
	}
}

// runcSpec edits runc's default spec (`runc spec`: namespaces, masked
// paths, the default mounts) into rt's container: its process, user,
// capabilities, root filesystem, mounts and network namespace.
func runcSpec(base map[string]any, rt *podRuntime, rootfs, netns string) (map[string]any, error) {
	process, ok := base["process"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("runc spec: no process")
	}
	process["terminal"] = false
	process["args"] = rt.Args
	process["env"] = rt.Env
	process["cwd"] = rt.Cwd
	user := map[string]any{"uid": rt.UID, "gid": rt.GID}
	if len(rt.ExtraGIDs) > 0 {
		user["additionalGids"] = rt.ExtraGIDs
	}
	process["user"] = user
	process["noNewPrivileges"] = rt.NoNewPrivileges
	caps := append([]string{}, rt.CapabilitiesAdd...)
	process["capabilities"] = map[string]any{"bounding": caps, "effective": caps, "permitted": caps}
	delete(process, "rlimits")
	root, ok := base["root"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("runc spec: no root")
	}
	root["path"] = rootfs
	root["readonly"] = rt.ReadOnlyRoot
	mounts, _ := base["mounts"].([]any)
	for _, m := range rt.Mounts {
		opts := []string{"rbind", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		mounts = append(mounts, map[string]any{"destination": m.Destination, "type": "bind", "source": m.Source, "options": opts})
	}
	base["mounts"] = mounts
	linux, ok := base["linux"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("runc spec: no linux section")
	}
	nss, _ := linux["namespaces"].([]any)
	found := false
	for _, n := range nss {
		if ns, ok := n.(map[string]any); ok && ns["type"] == "network" {
			ns["path"] = netns
			found = true
		}
	}
	if !found {
		nss = append(nss, map[string]any{"type": "network", "path": netns})
	}
	linux["namespaces"] = nss
	return base, nil
}

// startContainer writes an OCI bundle of rootfs (already unpacked) and rt
// and starts `runc run` in the background; the container is killed and
// deleted when the test ends.
func startContainer(t *testing.T, id string, rt *podRuntime, rootfs, netns string) *container {
	t.Helper()
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Fatalf("runc is needed to run the endpoint's image (apt-get install runc): %v", err)
	}
	bundle := t.TempDir()
	if out, err := exec.Command(runc, "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		t.Fatalf("runc spec: %v: %s", err, out)
	}
	path := filepath.Join(bundle, "config.json")
	var base map[string]any
	if err := readJSON(path, &base); err != nil {
		t.Fatal(err)
	}
	spec, err := runcSpec(base, rt, rootfs, netns)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	_ = exec.Command(runc, "delete", "--force", id).Run()
	c := &container{ID: id, runc: runc, out: &syncBuffer{}, done: make(chan struct{})}
	c.cmd = exec.Command(runc, "run", "--bundle", bundle, id)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("runc run: %v", err)
	}
	go func() { c.err = c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		_ = exec.Command(runc, "kill", id, "TERM").Run()
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			_ = exec.Command(runc, "kill", id, "KILL").Run()
			<-c.done
		}
		_ = exec.Command(runc, "delete", "--force", id).Run()
	})
	return c
}

// syncBuffer is a bytes.Buffer safe for a writer and readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// probeOnce runs an httpGet or tcpSocket probe against the Pod's address
// as the kubelet does (from the node; HTTPS without verification; 2xx and
// 3xx pass); a probe of another kind is an error.
func probeOnce(ctx context.Context, p *corev1.Probe, podIP string, ports map[string]int32) error {
	timeout := time.Duration(max(p.TimeoutSeconds, 1)) * time.Second
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case p.HTTPGet != nil:
		port, err := probePort(p.HTTPGet.Port, ports)
		if err != nil {
			return err
		}
		scheme := "http"
		if p.HTTPGet.Scheme == corev1.URISchemeHTTPS {
			scheme = "https"
		}
		url := fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(podIP, strconv.Itoa(int(port))), p.HTTPGet.Path)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		for _, h := range p.HTTPGet.HTTPHeaders {
			req.Header.Add(h.Name, h.Value)
		}
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the kubelet does not verify probe certificates
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return nil
	case p.TCPSocket != nil:
		port, err := probePort(p.TCPSocket.Port, ports)
		if err != nil {
			return err
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(podIP, strconv.Itoa(int(port))))
		if err != nil {
			return err
		}
		return c.Close()
	}
	return fmt.Errorf("probe: a kind the kubelet stand-in does not support (httpGet, tcpSocket)")
}

func probePort(p intstr.IntOrString, ports map[string]int32) (int32, error) {
	if p.Type == intstr.Int {
		return p.IntVal, nil
	}
	n, ok := ports[p.StrVal]
	if !ok {
		return 0, fmt.Errorf("probe port %q names no port of the container", p.StrVal)
	}
	return n, nil
}

// waitReady runs the probe every periodSeconds until it passes
// successThreshold times in a row, the container exits, or timeout.
func waitReady(ctx context.Context, c *container, p *corev1.Probe, podIP string, ports map[string]int32, timeout time.Duration) error {
	if p == nil {
		return fmt.Errorf("the container has no readinessProbe")
	}
	period := time.Duration(max(p.PeriodSeconds, 1)) * time.Second
	need := max(int(p.SuccessThreshold), 1)
	deadline := time.Now().Add(timeout)
	var last error
	for ok := 0; ok < need; {
		if exited, err := c.Exited(); exited {
			return fmt.Errorf("the container exited (%v) before it was ready", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready within %s: last probe: %w", timeout, last)
		}
		if last = probeOnce(ctx, p, podIP, ports); last == nil {
			ok++
		} else {
			ok = 0
		}
		if ok < need {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(period):
			}
		}
	}
	return nil
}

// Process reads /proc/<pid>/<file> of the container's process, as runc
// state reports its pid: what the process really got (environ,
// mountinfo, status).
func (c *container) Process(file string) ([]byte, error) {
	out, err := exec.Command(c.runc, "state", c.ID).Output()
	if err != nil {
		return nil, fmt.Errorf("runc state %s: %w", c.ID, err)
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("runc state %s: %w", c.ID, err)
	}
	return os.ReadFile(filepath.Join("/proc", strconv.Itoa(st.Pid), file))
}
