package dig

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"

	"golang.org/x/net/dns/dnsmessage"
)

// Upstream stands in for a VM's usual resolver (a VPC's resolver): a DNS
// server on a loopback address of its own, port 53 (resolv.conf, where
// pilot-agent finds it, has no port syntax). It answers NXDOMAIN for names
// under cluster.local, as a VPC resolver does, and Answer for every other
// name's A query, and records every name it is asked.
type Upstream struct {
	Addr   netip.Addr
	Answer netip.Addr
	pc     net.PacketConn
	mu     sync.Mutex
	asked  []string
}

// StartUpstream serves an Upstream answering answer on a free loopback
// address in 127.53.0.0/16, port 53 (which needs root or
// CAP_NET_BIND_SERVICE).
func StartUpstream(answer netip.Addr) (*Upstream, error) {
	var lastErr error
	for range 20 {
		addr := netip.AddrFrom4([4]byte{127, 53, byte(1 + rand.IntN(250)), byte(1 + rand.IntN(250))})
		pc, err := net.ListenPacket("udp", netip.AddrPortFrom(addr, 53).String())
		if err != nil {
			lastErr = err
			continue
		}
		u := &Upstream{Addr: addr, Answer: answer, pc: pc}
		go u.serve()
		return u, nil
	}
	return nil, fmt.Errorf("upstream resolver: listen on a loopback address, port 53 (needs root or CAP_NET_BIND_SERVICE): %w", lastErr)
}

// ResolvConf is the resolv.conf that names u.
func (u *Upstream) ResolvConf() []byte {
	return fmt.Appendf(nil, "nameserver %s\n", u.Addr)
}

// Asked returns the names u was asked, fully qualified, in order.
func (u *Upstream) Asked() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.asked...)
}

// Close stops serving.
func (u *Upstream) Close() error { return u.pc.Close() }

func (u *Upstream) serve() {
	buf := make([]byte, 4096)
	for {
		n, from, err := u.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if reply, ok := u.answer(buf[:n]); ok {
			_, _ = u.pc.WriteTo(reply, from)
		}
	}
}

// answer builds the reply to query; false for what is not a query with a
// question.
func (u *Upstream) answer(query []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	name := strings.ToLower(q.Name.String())
	u.mu.Lock()
	u.asked = append(u.asked, name)
	u.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if name == "cluster.local." || strings.HasSuffix(name, ".cluster.local.") {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	if rh.RCode == dnsmessage.RCodeSuccess && q.Type == dnsmessage.TypeA {
		_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: u.Answer.As4()})
	}
	out, err := b.Finish()
	return out, err == nil
}
