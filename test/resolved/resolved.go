// Package resolved runs a VM's resolver for tests: Debian's real
// systemd-resolved (unpacked by `make testenv` into
// bin/testenv/systemd-resolved) on a D-Bus system bus of its own, in a
// network namespace and a mount namespace of their own (a private /run),
// with an uplink link, so that the commands the onboarding agent runs (ip,
// resolvectl) and the queries a VM's programs make (its stub, 127.0.0.53)
// meet the resolver a VM runs, without touching the machine's own.
//
// Needs root (network namespaces, mounts), dbus-daemon, nsenter and the
// machine's libsystemd-shared (package systemd).
package resolved

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/embark-mesh/embark/test/testenv"
)

// Stub is resolved's stub listener, the address a VM's /etc/resolv.conf names.
const Stub = "127.0.0.53:53"

// Options configure the resolver.
type Options struct {
	// GlobalDNS are resolved's global servers (resolved.conf DNS=), as an
	// operator sets them: ip[:port] each. Default none.
	GlobalDNS []string
	// UplinkDNS are the servers of the uplink link (uplink0), as DHCP gives
	// them: ip[:port] each. Default none.
	UplinkDNS []string
}

// Host is the VM's resolver.
type Host struct {
	// NetNS is the network namespace's name (ip netns).
	NetNS string
	pid   int
	bin   string
}

// Start starts systemd-resolved as Options say and waits until resolvectl
// reaches it. Everything stops and goes with the test.
func Start(t *testing.T, o Options) *Host {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("resolved: the VM resolver needs root (network and mount namespaces)")
	}
	assets, err := testenv.AssetsDir("")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(assets, "systemd-resolved")
	daemon := filepath.Join(dir, "lib", "systemd", "systemd-resolved")
	if _, err := os.Stat(daemon); err != nil {
		t.Fatalf("resolved: %v: run `make testenv` (test/tools/resolved.sh)", err)
	}
	for _, tool := range []string{"dbus-daemon", "nsenter", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("resolved: %s: %v (apt-get install dbus-daemon util-linux iproute2)", tool, err)
		}
	}
	h := &Host{NetNS: fmt.Sprintf("embark-res-%d", rand.IntN(1_000_000)), bin: filepath.Join(dir, "usr", "bin")}
	work := t.TempDir()
	if err := writeFiles(work, o); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"netns", "add", h.NetNS},
		{"-n", h.NetNS, "link", "set", "lo", "up"},
		{"-n", h.NetNS, "link", "add", "uplink0", "type", "veth", "peer", "name", "uplink0p"},
		{"-n", h.NetNS, "address", "add", "10.53.0.2/24", "dev", "uplink0"},
		{"-n", h.NetNS, "link", "set", "uplink0p", "up"},
		{"-n", h.NetNS, "link", "set", "uplink0", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", h.NetNS).Run() })

	// ip netns exec gives the command a mount namespace of its own (a slave
	// of the host's): the private /run, users and resolv.conf stay there.
	script := `set -e
mount -t tmpfs tmpfs /run
mkdir -p /run/dbus /run/systemd/resolved.conf.d
mount --bind "$W/passwd" /etc/passwd
mount --bind "$W/group" /etc/group
mount --bind "$W/resolv.conf" /etc/resolv.conf
cp "$W/resolved.conf" /run/systemd/resolved.conf.d/test.conf
dbus-daemon --config-file="$W/dbus.conf" --nofork --nopidfile &
echo $! >"$W/dbus.pid"
for i in $(seq 50); do [ -S /run/dbus/system_bus_socket ] && break; sleep 0.1; done
exec "$D"
`
	cmd := exec.Command("ip", "netns", "exec", h.NetNS, "sh", "-c", script)
	cmd.Env = append(os.Environ(), "W="+work, "D="+daemon, "SYSTEMD_LOG_LEVEL=info")
	// A file, not a pipe: dbus-daemon inherits it and outlives the shell.
	logs, err := os.Create(filepath.Join(work, "resolved.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	cmd.Stdout, cmd.Stderr = logs, logs
	readLogs := func() string { b, _ := os.ReadFile(logs.Name()); return string(b) }
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h.pid = cmd.Process.Pid
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		if b, err := os.ReadFile(filepath.Join(work, "dbus.pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("systemd-resolved:\n%s", readLogs())
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, err := h.Run(t.Context(), "resolvectl", "status")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("resolved did not start: resolvectl status: %v: %s\n%s", err, out, readLogs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(o.UplinkDNS) > 0 {
		if out, err := h.Run(t.Context(), append([]string{"resolvectl", "dns", "uplink0"}, o.UplinkDNS...)...); err != nil {
			t.Fatalf("resolvectl dns uplink0: %v: %s", err, out)
		}
	}
	return h
}

// writeFiles writes the bus's configuration (anyone may own any name: the
// bus serves this resolver only), the users resolved runs as, an
// /etc/resolv.conf without servers (resolved would import them) and
// resolved.conf with the global servers.
func writeFiles(dir string, o Options) error {
	passwd, err := os.ReadFile("/etc/passwd")
	if err != nil {
		return err
	}
	group, err := os.ReadFile("/etc/group")
	if err != nil {
		return err
	}
	if !bytes.Contains(passwd, []byte("\nsystemd-resolve:")) {
		passwd = append(passwd, "systemd-resolve:x:991:991:systemd Resolver:/:/usr/sbin/nologin\n"...)
		group = append(group, "systemd-resolve:x:991:\n"...)
	}
	conf := "[Resolve]\nLLMNR=no\nMulticastDNS=no\nDNSSEC=no\nDNSStubListener=yes\n"
	if len(o.GlobalDNS) > 0 {
		conf += "DNS=" + strings.Join(o.GlobalDNS, " ") + "\n"
	}
	files := map[string]string{
		"passwd":        string(passwd),
		"group":         string(group),
		"resolv.conf":   "# the VM's servers are resolved's own (resolved.conf, uplink0)\n",
		"resolved.conf": conf,
		"dbus.conf": `<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN" "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=/run/dbus/system_bus_socket</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
`,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Run runs argv as root in the VM's namespaces (resolvectl from the
// unpacked package first on PATH) and returns its combined output: the
// hostdns.Options Run of the VM.
func (h *Host) Run(ctx context.Context, argv ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"-t", strconv.Itoa(h.pid), "-m", "-n", "--"}, argv...)...)
	cmd.Env = append(os.Environ(), "PATH="+h.bin+":"+os.Getenv("PATH"), "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0")
	return cmd.CombinedOutput()
}

// ListenPacket opens a packet socket inside the VM's network namespace
// (for a DNS server of the VM's network); serve it from anywhere.
func (h *Host) ListenPacket(network, addr string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := h.inNetns(func() error {
		var err error
		pc, err = net.ListenPacket(network, addr)
		return err
	})
	return pc, err
}

// Dial connects from inside the VM's network namespace (a program of the
// VM asking its stub).
func (h *Host) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := h.inNetns(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// inNetns runs f on a locked OS thread that is in the VM's network
// namespace while f runs; a thread that cannot move back is not unlocked,
// so the runtime ends it.
func (h *Host) inNetns(f func() error) error {
	runtime.LockOSThread()
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer self.Close()
	target, err := os.Open("/run/netns/" + h.NetNS)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %s: %w", h.NetNS, err)
	}
	ferr := f()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("setns back: %w (after: %v)", err, ferr)
	}
	runtime.UnlockOSThread()
	return ferr
}
