//go:build install

package install

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// podNetwork is a network namespace joined to the host's by one veth pair:
// HostIP on the host's end, PeerIP inside. The endpoint's Pod runs in one
// (the "pod network", netns embark-pod); the cluster test also stands one
// up as the VM's side to dial the gateway from.
type podNetwork struct {
	Name           string
	HostIP, PeerIP netip.Addr
}

// netnsPath is where `ip netns` keeps a named namespace.
func netnsPath(name string) string { return filepath.Join("/var/run/netns", name) }

// newPodNetwork creates netns name with a veth pair (name+"-h" on the host,
// name+"-p" inside), the addresses hostCIDR and peerCIDR, loopback up and,
// with defaultRoute, a default route via the host's end. A namespace of the
// same name left by an earlier run is removed first. It is removed when the
// test ends.
func newPodNetwork(t *testing.T, name, hostCIDR, peerCIDR string, defaultRoute bool) *podNetwork {
	t.Helper()
	host, err := netip.ParsePrefix(hostCIDR)
	if err != nil {
		t.Fatalf("pod network %s: host address: %v", name, err)
	}
	peer, err := netip.ParsePrefix(peerCIDR)
	if err != nil {
		t.Fatalf("pod network %s: peer address: %v", name, err)
	}
	hostIf, peerIf := name+"-h", name+"-p"
	removeNetwork(name, hostIf)
	t.Cleanup(func() { removeNetwork(name, hostIf) })
	steps := [][]string{
		{"netns", "add", name},
		{"link", "add", hostIf, "type", "veth", "peer", "name", peerIf},
		{"link", "set", peerIf, "netns", name},
		{"addr", "add", hostCIDR, "dev", hostIf},
		{"link", "set", hostIf, "up"},
		{"-n", name, "addr", "add", peerCIDR, "dev", peerIf},
		{"-n", name, "link", "set", peerIf, "up"},
		{"-n", name, "link", "set", "lo", "up"},
	}
	if defaultRoute {
		steps = append(steps, []string{"-n", name, "route", "add", "default", "via", host.Addr().String()})
	}
	for _, args := range steps {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("pod network %s: ip %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
	}
	return &podNetwork{Name: name, HostIP: host.Addr(), PeerIP: peer.Addr()}
}

func removeNetwork(name, hostIf string) {
	_ = exec.Command("ip", "link", "del", hostIf).Run()
	_ = exec.Command("ip", "netns", "del", name).Run()
}

// Listen opens a listener inside the namespace: the socket is created on
// an OS thread moved into the namespace and stays there when the thread
// moves back.
func (n *podNetwork) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := n.do(func() error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// Dial connects from inside the namespace.
func (n *podNetwork) Dial(network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.do(func() error {
		var err error
		c, err = net.Dial(network, addr)
		return err
	})
	return c, err
}

// do runs fn on a locked OS thread switched into the namespace. If the
// thread cannot switch back it stays locked, so the runtime ends it with
// the goroutine instead of reusing it in the wrong namespace.
func (n *podNetwork) do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open own network namespace: %w", err)
			return
		}
		defer unix.Close(self)
		target, err := unix.Open(netnsPath(n.Name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open network namespace %s: %w", n.Name, err)
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace %s: %w", n.Name, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(self, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("leave network namespace %s: %w", n.Name, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
