//go:build install

package install

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// VM is a simulated VM: the host's root filesystem seen through an overlay
// (every change lands in a private upper directory, the host is untouched)
// in a private mount namespace, chrooted, in the network namespace of a
// Network. Its programs are the host's (bash, apt-get, dpkg, gpg, curl,
// setpriv); systemd is not PID 1, so sudo, systemctl and journalctl are the
// stand-ins of test/install/shims.
type VM struct {
	t       *testing.T
	net     *Network
	root    string // the overlay's mount point, in the VM's mount namespace
	holder  *exec.Cmd
	mntNS   string // /proc/<holder>/ns/mnt
	mntID   string // its identity, to find the VM's processes
	hostsOf map[string]netip.Addr
}

// Paths cleared in the overlay: nothing of the host's own Embark or Istio
// installation (a developer's machine may have one) leaks into the VM.
var vmClean = []string{
	"etc/onboarding-agent", "var/lib/onboarding-agent", "var/lib/istio", "etc/istio", "etc/certs",
	"var/log/istio", "usr/local/bin/istio-start.sh", "usr/local/bin/pilot-agent", "usr/local/bin/envoy",
	"etc/apt/sources.list.d", "etc/apt/sources.list", "etc/apt/keyrings/embark.asc", "var/lib/apt/lists",
	"usr/local/share/ca-certificates/embark.crt", "var/log/stand-in-journal", "etc/cloud",
}

// StartVM starts a VM in net whose /etc/hosts maps each name of hosts to its
// address (the VM has no DNS). Its apt has no source but what the guide
// adds: the VM reaches nothing but the gateway. The VM's processes are
// killed and its overlay unmounted at the end of the test.
func StartVM(t *testing.T, net *Network, hosts map[string]netip.Addr) *VM {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the simulated VM needs root (mount namespaces, chroot, network namespaces); CI runs as root")
	}
	dir := t.TempDir()
	v := &VM{t: t, net: net, root: filepath.Join(dir, "root"), hostsOf: hosts}
	for _, d := range []string{"upper", "work", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The holder keeps the mount namespace alive; it is the only process
	// that is not the VM's own.
	script := fmt.Sprintf(`set -e
mount -t overlay overlay -o lowerdir=/,upperdir=%[1]s/upper,workdir=%[1]s/work %[2]s
mount --rbind /dev %[2]s/dev
mount -t proc proc %[2]s/proc
mount -t tmpfs -o mode=0755 tmpfs %[2]s/run
mount -t tmpfs -o mode=1777 tmpfs %[2]s/tmp
mkdir -p %[2]s/run/systemd/system
echo ready
exec sleep infinity
`, dir, v.root)
	v.holder = exec.Command("unshare", "-m", "--propagation", "private", "--", "sh", "-c", script)
	out, err := v.holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	v.holder.Stderr = &stderr
	if err := v.holder.Start(); err != nil {
		t.Fatalf("start the VM's mount namespace: %v", err)
	}
	t.Cleanup(v.stop)
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("the VM's mount namespace: %q %v: %s", line, err, stderr.String())
	}
	v.mntNS = fmt.Sprintf("/proc/%d/ns/mnt", v.holder.Process.Pid)
	if v.mntID, err = os.Readlink(v.mntNS); err != nil {
		t.Fatal(err)
	}
	if err := v.prepare(); err != nil {
		t.Fatalf("prepare the VM: %v", err)
	}
	return v
}

// Path is name (absolute, inside the VM) as the host sees it. Symbolic
// links in name resolve in the host's root: use ReadFile to read through
// them.
func (v *VM) Path(name string) string {
	return filepath.Join(fmt.Sprintf("/proc/%d/root", v.holder.Process.Pid), v.root, name)
}

// ReadFile reads a file of the VM, inside the VM (its symbolic links, such
// as Istio's /etc/istio -> /var/lib/istio, resolve in the VM's root).
func (v *VM) ReadFile(name string) (string, error) {
	cmd := exec.CommandContext(v.t.Context(), "nsenter", "--mount="+v.mntNS, "--", "chroot", v.root, "cat", "--", name)
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("read %s in the VM: %w", name, err)
	}
	return string(out), nil
}

// WriteFile writes a file of the VM, creating its directory.
func (v *VM) WriteFile(name string, data []byte, mode os.FileMode) error {
	p := v.Path(name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, data, mode)
}

func (v *VM) prepare() error {
	for _, p := range vmClean {
		if err := os.RemoveAll(v.Path(p)); err != nil {
			return err
		}
	}
	for _, d := range []string{"etc/apt/sources.list.d", "var/lib/apt/lists/partial"} {
		if err := os.MkdirAll(v.Path(d), 0o755); err != nil {
			return err
		}
	}
	names := make([]string, 0, len(v.hostsOf))
	for n := range v.hostsOf {
		names = append(names, n)
	}
	sort.Strings(names)
	hosts := "127.0.0.1 localhost\n::1 localhost\n"
	for _, n := range names {
		hosts += v.hostsOf[n].String() + " " + n + "\n"
	}
	if err := v.WriteFile("/etc/hosts", []byte(hosts), 0o644); err != nil {
		return err
	}
	if err := v.WriteFile("/etc/resolv.conf", []byte("# the simulated VM has no DNS: /etc/hosts only\n"), 0o644); err != nil {
		return err
	}
	_, file, _, _ := runtime.Caller(0)
	for _, s := range []string{"sudo", "systemctl", "journalctl"} {
		b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "shims", s))
		if err != nil {
			return fmt.Errorf("stand-in %s: %w", s, err)
		}
		if err := v.WriteFile("/usr/bin/"+s, b, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// Run runs script with bash -e in the VM as root, with env added to a
// minimal environment, and returns its combined output.
func (v *VM) Run(ctx context.Context, script string, env map[string]string) (string, error) {
	return v.RunUntil(ctx, script, env, nil)
}

// RunUntil is Run that interrupts the script (SIGINT to its process group,
// as Ctrl-C does to a command a user watches, e.g. journalctl -f) once
// until reports true for the output so far; it then returns that output and
// no error. until is polled every 200 ms.
func (v *VM) RunUntil(ctx context.Context, script string, env map[string]string, until func(out string) bool) (string, error) {
	cmd := exec.CommandContext(ctx, "nsenter", "--mount="+v.mntNS, "--net=/run/netns/"+v.net.Name, "--",
		"chroot", v.root, "/bin/bash", "-e", "-c", script)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "USER=root",
		"LANG=C.UTF-8", "DEBIAN_FRONTEND=noninteractive", "TERM=dumb"}
	for k, val := range env {
		cmd.Env = append(cmd.Env, k+"="+val)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) }
	cmd.WaitDelay = 10 * time.Second
	out := &vmOutput{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("run in the VM: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				return out.String(), fmt.Errorf("in the VM: %w", err)
			}
			return out.String(), nil
		case <-tick.C:
			if until != nil && until(out.String()) {
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
				<-done
				return out.String(), nil
			}
		}
	}
}

// Connect opens (and closes) a TCP connection to addr (host:port) from
// inside the VM, with bash's /dev/tcp, giving up after 5 s.
func (v *VM) Connect(ctx context.Context, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	out, err := v.Run(ctx, fmt.Sprintf("timeout 5 bash -c 'exec 3<>/dev/tcp/%s/%s'", host, port), nil)
	if err != nil {
		return fmt.Errorf("connect to %s from the VM: %w: %s", addr, err, strings.TrimSpace(out))
	}
	return nil
}

// Processes lists the VM's processes (those in its mount namespace but the
// holder), as pid -> command line.
func (v *VM) Processes() map[int]string {
	procs := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == v.holder.Process.Pid {
			continue
		}
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err != nil || ns != v.mntID {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		procs[pid] = strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	return procs
}

func (v *VM) stop() {
	for i := 0; i < 3; i++ {
		procs := v.Processes()
		if len(procs) == 0 {
			break
		}
		for pid := range procs {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if v.holder.Process != nil {
		_ = v.holder.Process.Kill()
		err := v.holder.Wait()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			v.t.Logf("VM holder: %v", err)
		}
	}
}

// vmOutput is a bytes.Buffer safe for one writer and concurrent readers.
type vmOutput struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *vmOutput) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *vmOutput) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
