//go:build install

package install

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// Network is a network namespace joined to the host by one veth pair: the
// host side has HostIP, the side in the namespace PeerIP.
type Network struct {
	// Name is the namespace's name (ip netns), /run/netns/<Name>.
	Name           string
	HostIP, PeerIP netip.Addr
	hostLink       string
}

// NewNetwork creates the network namespace name with a veth pair: hostCIDR
// on the host side, peerCIDR inside. With defaultRoute the namespace routes
// everything through the host side; without it only the veth's subnet (and
// the namespace's own loopback) is reachable, so the host's loopback
// listeners are not. The namespace and the veth are removed at the end of
// the test. A namespace of the same name left by an earlier run is removed
// first.
func NewNetwork(t *testing.T, name string, hostCIDR, peerCIDR string, defaultRoute bool) *Network {
	t.Helper()
	host, err := netip.ParsePrefix(hostCIDR)
	if err != nil {
		t.Fatalf("network %s: host address: %v", name, err)
	}
	peer, err := netip.ParsePrefix(peerCIDR)
	if err != nil {
		t.Fatalf("network %s: peer address: %v", name, err)
	}
	short := name
	if len(short) > 12 { // interface names have at most 15 bytes
		short = short[:12]
	}
	n := &Network{Name: name, HostIP: host.Addr(), PeerIP: peer.Addr(), hostLink: short + "-h"}
	peerLink := short + "-p"
	n.teardown()
	t.Cleanup(n.teardown)
	steps := [][]string{
		{"netns", "add", name},
		{"link", "add", n.hostLink, "type", "veth", "peer", "name", peerLink},
		{"link", "set", peerLink, "netns", name},
		{"addr", "add", hostCIDR, "dev", n.hostLink},
		{"link", "set", n.hostLink, "up"},
		{"-n", name, "addr", "add", peerCIDR, "dev", peerLink},
		{"-n", name, "link", "set", peerLink, "up"},
		{"-n", name, "link", "set", "lo", "up"},
	}
	if defaultRoute {
		steps = append(steps, []string{"-n", name, "route", "add", "default", "via", host.Addr().String()})
	}
	for _, s := range steps {
		if err := ip(t.Context(), s...); err != nil {
			t.Fatalf("network %s: %v", name, err)
		}
	}
	return n
}

// AddLocalAddress adds addr (e.g. 169.254.169.254/32) to the namespace's
// loopback, for a listener at an address the host must not have.
func (n *Network) AddLocalAddress(ctx context.Context, cidr string) error {
	return ip(ctx, "-n", n.Name, "addr", "add", cidr, "dev", "lo")
}

func (n *Network) teardown() {
	_ = exec.Command("ip", "link", "del", n.hostLink).Run()
	_ = exec.Command("ip", "netns", "del", n.Name).Run()
}

func ip(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Listen opens a listener inside the namespace: the socket is created on an
// OS thread moved into the namespace and stays there; the thread moves
// back before it serves any other goroutine. Accepting and serving happen
// anywhere (a socket belongs to the namespace it was created in).
func (n *Network) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.inNetns(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen %s %s in netns %s: %w", network, addr, n.Name, err)
	}
	return l, nil
}

// inNetns runs f on a locked OS thread that is in the namespace while f
// runs. If the thread cannot be moved back it is not unlocked, so the
// runtime ends it with the goroutine rather than reuse it.
func (n *Network) inNetns(f func() error) error {
	runtime.LockOSThread()
	self, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open own netns: %w", err)
	}
	defer self.Close()
	target, err := os.Open("/run/netns/" + n.Name)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open netns %s: %w", n.Name, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %s: %w", n.Name, err)
	}
	ferr := f()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("setns back to the host: %w (after: %v)", err, ferr)
	}
	runtime.UnlockOSThread()
	return ferr
}

// relayTCP accepts on l until it is closed and copies each connection both
// ways to a new connection to target, dialled from the host's namespace.
func relayTCP(l net.Listener, target string) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			u, err := net.Dial("tcp", target)
			if err != nil {
				return
			}
			defer u.Close()
			var wg sync.WaitGroup
			wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer wg.Done()
				_, _ = io.Copy(dst, src)
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
			}
			go pipe(u, c)
			go pipe(c, u)
			wg.Wait()
		}()
	}
}
