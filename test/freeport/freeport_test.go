package freeport

import (
	"net"
	"testing"
)

func TestPortsAreBelowTheEphemeralRangeAndNeverRepeat(t *testing.T) {
	lo, hi := window()
	seen := map[int]bool{}
	for range 200 {
		p, err := Port()
		if err != nil {
			t.Fatal(err)
		}
		if hi > lo && (p < lo || p >= hi) {
			t.Fatalf("port %d outside [%d, %d)", p, lo, hi)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}

func TestAPortInUseIsNotFree(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().(*net.TCPAddr).Port
	if free(taken, false) {
		t.Fatalf("port %d reported free while listened on", taken)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	udpTaken := pc.LocalAddr().(*net.UDPAddr).Port
	if free(udpTaken, true) {
		t.Fatalf("port %d reported free for DNS while its UDP port is bound", udpTaken)
	}
}

func TestDNSAddrListensOnUDPAndTCP(t *testing.T) {
	a, err := DNSAddr()
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", a)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	l, err := net.Listen("tcp", a)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
}
