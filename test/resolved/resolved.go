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
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
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
	work  string
	cmd   *exec.Cmd
	done  chan struct{}
}

// Start starts systemd-resolved as Options say (New) and stops it when the
// test ends, with its log if the test failed.
func Start(t *testing.T, o Options) *Host {
	t.Helper()
	h, err := New(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("systemd-resolved:\n%s", h.Log())
		}
		h.Close()
	})
	return h
}

// New starts systemd-resolved as Options say and waits until resolvectl
// reaches it. Close stops it and removes its namespaces.
func New(ctx context.Context, o Options) (*Host, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("resolved: the VM resolver needs root (network and mount namespaces)")
	}
	assets, err := testenv.AssetsDir("")
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(assets, "systemd-resolved")
	daemon := filepath.Join(dir, "lib", "systemd", "systemd-resolved")
	if _, err := os.Stat(daemon); err != nil {
		return nil, fmt.Errorf("resolved: %w: run `make testenv` (test/tools/resolved.sh)", err)
	}
	for _, tool := range []string{"dbus-daemon", "nsenter", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("resolved: %s: %w (apt-get install dbus-daemon util-linux iproute2)", tool, err)
		}
	}
	work, err := os.MkdirTemp("", "embark-resolved-")
	if err != nil {
		return nil, err
	}
	h := &Host{NetNS: fmt.Sprintf("embark-res-%d", rand.IntN(1_000_000)), bin: filepath.Join(dir, "usr", "bin"), work: work}
	if err := h.start(ctx, o, daemon); err != nil {
		log := h.Log()
		h.Close()
		return nil, fmt.Errorf("%w\n%s", err, log)
	}
	return h, nil
}

func (h *Host) start(ctx context.Context, o Options, daemon string) error {
	if err := writeFiles(h.work, o); err != nil {
		return err
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
			return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
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
	h.cmd = exec.Command("ip", "netns", "exec", h.NetNS, "sh", "-c", script)
	h.cmd.Env = append(os.Environ(), "W="+h.work, "D="+daemon, "SYSTEMD_LOG_LEVEL=info")
	// A file, not a pipe: dbus-daemon inherits it and outlives the shell.
	logs, err := os.Create(filepath.Join(h.work, "resolved.log"))
	if err != nil {
		return err
	}
	defer logs.Close()
	h.cmd.Stdout, h.cmd.Stderr = logs, logs
	if err := h.cmd.Start(); err != nil {
		return err
	}
	h.pid = h.cmd.Process.Pid
	h.done = make(chan struct{})
	go func() { _ = h.cmd.Wait(); close(h.done) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, err := h.Run(ctx, "resolvectl", "status")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("resolved did not start: resolvectl status: %w: %s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(o.UplinkDNS) > 0 {
		if out, err := h.Run(ctx, append([]string{"resolvectl", "dns", "uplink0"}, o.UplinkDNS...)...); err != nil {
			return fmt.Errorf("resolvectl dns uplink0: %w: %s", err, out)
		}
	}
	return nil
}

// Log is what resolved and its bus wrote.
func (h *Host) Log() string {
	b, _ := os.ReadFile(filepath.Join(h.work, "resolved.log"))
	return string(b)
}

// Close stops resolved and its bus and deletes the namespace.
func (h *Host) Close() {
	if b, err := os.ReadFile(filepath.Join(h.work, "dbus.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
	if h.cmd != nil && h.cmd.Process != nil {
		_ = h.cmd.Process.Kill()
		<-h.done
	}
	_ = exec.Command("ip", "netns", "del", h.NetNS).Run()
	_ = os.RemoveAll(h.work)
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

// Relay listens on the VM's loopback and forwards each UDP query to a
// server in the caller's network namespace and its answer back: the
// sidecar's DNS proxy at its address on the VM, where the sidecar runs in
// the test's namespace (a stand-in for "the same host"). It counts the
// names it was asked.
type Relay struct {
	pc     net.PacketConn
	target string
	mu     sync.Mutex
	seen   map[string]int
}

// RelayUDP starts a Relay from listen (inside the VM) to target.
func (h *Host) RelayUDP(listen, target string) (*Relay, error) {
	pc, err := h.ListenPacket("udp", listen)
	if err != nil {
		return nil, err
	}
	r := &Relay{pc: pc, target: target, seen: map[string]int{}}
	go r.serve()
	return r, nil
}

func (r *Relay) serve() {
	buf := make([]byte, 4096)
	for {
		n, from, err := r.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		q := append([]byte(nil), buf[:n]...)
		var p dnsmessage.Parser
		if _, err := p.Start(q); err == nil {
			if question, err := p.Question(); err == nil {
				r.mu.Lock()
				r.seen[strings.ToLower(question.Name.String())]++
				r.mu.Unlock()
			}
		}
		go r.forward(q, from)
	}
}

func (r *Relay) forward(q []byte, from net.Addr) {
	c, err := net.Dial("udp", r.target)
	if err != nil {
		return
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write(q); err != nil {
		return
	}
	reply := make([]byte, 65535)
	m, err := c.Read(reply)
	if err != nil {
		return
	}
	_, _ = r.pc.WriteTo(reply[:m], from)
}

// Asked is how many times the relay was asked for name (without the
// trailing dot).
func (r *Relay) Asked(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[strings.ToLower(name)+"."]
}

// Close stops the relay: the sidecar is gone for the VM.
func (r *Relay) Close() error { return r.pc.Close() }
