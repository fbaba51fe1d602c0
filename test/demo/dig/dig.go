// Package dig asks a DNS server for a name's A records over UDP and prints
// the query and the answer the way dig(1) prints them (Query,
// Response.String), and serves a stand-in for a VM's usual resolver
// (Upstream). Both use golang.org/x/net/dns/dnsmessage, the DNS message
// library already in the module graph.
package dig

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// queryTimeout bounds one query: a DNS client's usual wait.
const queryTimeout = 2 * time.Second

// Record is an A record of an answer.
type Record struct {
	Name string // fully qualified, with the trailing dot
	TTL  uint32
	Addr netip.Addr
}

// Response is a server's answer to an A query.
type Response struct {
	Server   string // ip:port asked
	Question string // fully qualified, with the trailing dot
	Header   dnsmessage.Header
	Answers  []Record
	// Counts are the section counts the response carried (question,
	// answer, authority, additional), as dig prints them.
	Counts [4]int
}

// Authoritative reports whether the server answered from its own data (the
// aa flag): pilot-agent sets it for the names in its name table, a
// forwarded answer does not have it.
func (r Response) Authoritative() bool { return r.Header.Authoritative }

// Addrs returns the addresses of the answer's A records.
func (r Response) Addrs() []netip.Addr {
	out := make([]netip.Addr, 0, len(r.Answers))
	for _, a := range r.Answers {
		out = append(out, a.Addr)
	}
	return out
}

// Query asks server (ip:port) for name's A records over UDP, once, with
// recursion desired, as `dig @ip -p port name` does.
func Query(ctx context.Context, server, name string) (Response, error) {
	q, err := dnsmessage.NewName(strings.TrimSuffix(name, ".") + ".")
	if err != nil {
		return Response{}, fmt.Errorf("name %q: %w", name, err)
	}
	id := uint16(rand.Uint32())
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	if err := b.StartQuestions(); err != nil {
		return Response{}, err
	}
	if err := b.Question(dnsmessage.Question{Name: q, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}); err != nil {
		return Response{}, fmt.Errorf("name %q: %w", name, err)
	}
	msg, err := b.Finish()
	if err != nil {
		return Response{}, err
	}
	reply, err := exchange(ctx, server, msg)
	if err != nil {
		return Response{}, err
	}
	r, err := parse(reply)
	if err != nil {
		return Response{}, fmt.Errorf("response from %s: %w", server, err)
	}
	if r.Header.ID != id {
		return Response{}, fmt.Errorf("response from %s has ID %d, want %d", server, r.Header.ID, id)
	}
	r.Server = server
	return r, nil
}

// exchange sends msg to server over UDP and returns the first datagram
// that comes back.
func exchange(ctx context.Context, server string, msg []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "udp", server)
	if err != nil {
		return nil, fmt.Errorf("ask %s: %w", server, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := conn.Write(msg); err != nil {
		return nil, fmt.Errorf("ask %s: %w", server, err)
	}
	buf := make([]byte, 65535)
	n, err := conn.Read(buf)
	if err != nil {
		return nil, fmt.Errorf("no answer from %s: %w", server, err)
	}
	return buf[:n], nil
}

// parse reads a response: header, question, A records of the answer
// section, and the section counts.
func parse(msg []byte) (Response, error) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		return Response{}, err
	}
	r := Response{Header: h}
	qs, err := p.AllQuestions()
	if err != nil {
		return Response{}, err
	}
	r.Counts[0] = len(qs)
	if len(qs) > 0 {
		r.Question = qs[0].Name.String()
	}
	for {
		rh, err := p.AnswerHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			break
		}
		if err != nil {
			return Response{}, err
		}
		r.Counts[1]++
		if rh.Type != dnsmessage.TypeA {
			if err := p.SkipAnswer(); err != nil {
				return Response{}, err
			}
			continue
		}
		a, err := p.AResource()
		if err != nil {
			return Response{}, err
		}
		r.Answers = append(r.Answers, Record{Name: rh.Name.String(), TTL: rh.TTL, Addr: netip.AddrFrom4(a.A)})
	}
	auth, err := p.AllAuthorities()
	if err != nil {
		return Response{}, err
	}
	r.Counts[2] = len(auth)
	add, err := p.AllAdditionals()
	if err != nil {
		return Response{}, err
	}
	r.Counts[3] = len(add)
	return r, nil
}

// Command is the dig command line that asks server (ip:port) for name.
func Command(server, name string) string {
	host, port, err := net.SplitHostPort(server)
	if err != nil {
		return "dig @" + server + " " + name
	}
	return fmt.Sprintf("dig @%s -p %s %s", host, port, name)
}

// String prints r as dig prints a response: the header, flags and section
// counts, the question, the A records of the answer and the server asked.
func (r Response) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, ";; ->>HEADER<<- opcode: QUERY, status: %s, id: %d\n", rcodeName(r.Header.RCode), r.Header.ID)
	fmt.Fprintf(&b, ";; flags: %s; QUERY: %d, ANSWER: %d, AUTHORITY: %d, ADDITIONAL: %d\n\n", flags(r.Header), r.Counts[0], r.Counts[1], r.Counts[2], r.Counts[3])
	fmt.Fprintf(&b, ";; QUESTION SECTION:\n;%s\t\tIN\tA\n", r.Question)
	if len(r.Answers) > 0 {
		b.WriteString("\n;; ANSWER SECTION:\n")
		for _, a := range r.Answers {
			fmt.Fprintf(&b, "%s\t%d\tIN\tA\t%s\n", a.Name, a.TTL, a.Addr)
		}
	}
	if host, port, err := net.SplitHostPort(r.Server); err == nil {
		fmt.Fprintf(&b, "\n;; SERVER: %s#%s(%s) (UDP)\n", host, port, host)
	}
	return b.String()
}

// flags lists the header's flags in dig's order.
func flags(h dnsmessage.Header) string {
	var f []string
	for _, x := range []struct {
		on   bool
		name string
	}{{h.Response, "qr"}, {h.Authoritative, "aa"}, {h.Truncated, "tc"}, {h.RecursionDesired, "rd"}, {h.RecursionAvailable, "ra"}} {
		if x.on {
			f = append(f, x.name)
		}
	}
	return strings.Join(f, " ")
}

// rcodeName is dig's name of a response code.
func rcodeName(c dnsmessage.RCode) string {
	switch c {
	case dnsmessage.RCodeSuccess:
		return "NOERROR"
	case dnsmessage.RCodeFormatError:
		return "FORMERR"
	case dnsmessage.RCodeServerFailure:
		return "SERVFAIL"
	case dnsmessage.RCodeNameError:
		return "NXDOMAIN"
	case dnsmessage.RCodeNotImplemented:
		return "NOTIMP"
	case dnsmessage.RCodeRefused:
		return "REFUSED"
	}
	return fmt.Sprintf("RCODE%d", c)
}
