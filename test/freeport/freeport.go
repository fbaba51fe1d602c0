// Package freeport hands out loopback ports for tests to listen on later,
// the one way every test in the tree picks them.
//
// A port taken from the kernel with "127.0.0.1:0" and released comes from
// the ephemeral range, where the kernel also picks the local ports of every
// outgoing connection (the tests' own clients of the API server, etcd and
// istiod) and of every other test's "127.0.0.1:0" listener: between the
// release and the test's own listen, the port can be taken, and the listen
// fails with "address already in use" (seen in CI). The ports here come
// from below the ephemeral range, chosen at random among those nothing
// listens on, and never twice in one process; the kernel hands none of them
// out by itself, so only another process choosing the same one in the same
// moment could take it.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// The window below the ephemeral range the ports come from: at most
// windowSize ports, none under minPort.
const (
	windowSize = 16384
	minPort    = 10000
	tries      = 256
)

var (
	mu    sync.Mutex
	given = map[int]bool{}
)

// Port returns a loopback port free for TCP now and not handed out before
// by this process.
func Port() (int, error) { return port(false) }

// DNSPort returns a loopback port free for UDP and TCP alike (a DNS server
// listens on both).
func DNSPort() (int, error) { return port(true) }

// Addr returns "127.0.0.1:<Port()>".
func Addr() (string, error) {
	p, err := Port()
	if err != nil {
		return "", err
	}
	return hostPort(p), nil
}

// DNSAddr returns "127.0.0.1:<DNSPort()>".
func DNSAddr() (string, error) {
	p, err := DNSPort()
	if err != nil {
		return "", err
	}
	return hostPort(p), nil
}

// MustAddr is Addr, failing t when no port is free.
func MustAddr(t testing.TB) string {
	t.Helper()
	a, err := Addr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// MustPort is Port, failing t when no port is free.
func MustPort(t testing.TB) int {
	t.Helper()
	p, err := Port()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// MustDNSAddr is DNSAddr, failing t when no port is free.
func MustDNSAddr(t testing.TB) string {
	t.Helper()
	a, err := DNSAddr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func hostPort(p int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)) }

func port(udp bool) (int, error) {
	mu.Lock()
	defer mu.Unlock()
	if lo, hi := window(); hi > lo {
		for range tries {
			p := lo + rand.IntN(hi-lo)
			if given[p] || !free(p, udp) {
				continue
			}
			given[p] = true
			return p, nil
		}
	}
	// No window below the ephemeral range (a machine whose range starts
	// low): the kernel's choice, with the race this package exists to avoid.
	for range tries {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("find a free loopback port: %w", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if given[p] || !free(p, udp) {
			continue
		}
		given[p] = true
		return p, nil
	}
	return 0, errors.New("find a free loopback port: none free")
}

// free reports whether p can be listened on now on loopback (and on
// every address: a listener on 0.0.0.0:p would refuse the test's later).
func free(p int, udp bool) bool {
	for _, host := range []string{"127.0.0.1", "0.0.0.0"} {
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			return false
		}
		_ = l.Close()
		if udp {
			pc, err := net.ListenPacket("udp", net.JoinHostPort(host, strconv.Itoa(p)))
			if err != nil {
				return false
			}
			_ = pc.Close()
		}
	}
	return true
}

// window is [lo, hi): the ports below the kernel's ephemeral range.
func window() (lo, hi int) {
	hi = 32768 // Linux's default first ephemeral port
	if data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(data)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				hi = n
			}
		}
	}
	lo = max(minPort, hi-windowSize)
	return lo, hi
}
