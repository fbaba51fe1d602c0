package dig

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

func TestQueryUpstream(t *testing.T) {
	answer := netip.MustParseAddr("192.0.2.53")
	u, err := StartUpstream(answer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = u.Close() })
	server := netip.AddrPortFrom(u.Addr, 53).String()
	for _, c := range []struct {
		name      string
		rcode     dnsmessage.RCode
		addrs     []netip.Addr
		printed   []string
		unprinted []string
	}{
		{"www.outside.example", dnsmessage.RCodeSuccess, []netip.Addr{answer},
			[]string{"status: NOERROR", "flags: qr rd ra;", "ANSWER: 1", ";www.outside.example.\t\tIN\tA", "www.outside.example.\t60\tIN\tA\t192.0.2.53", ";; SERVER: " + u.Addr.String() + "#53("},
			[]string{" aa"}},
		{"ratings.bookinfo.svc.cluster.local.", dnsmessage.RCodeNameError, nil,
			[]string{"status: NXDOMAIN", "ANSWER: 0"}, []string{"ANSWER SECTION"}},
	} {
		r, err := Query(t.Context(), server, c.name)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if r.Header.RCode != c.rcode || !slices.Equal(r.Addrs(), c.addrs) || r.Authoritative() {
			t.Errorf("%s: %v %v aa=%v, want %v %v, not authoritative", c.name, r.Header.RCode, r.Addrs(), r.Authoritative(), c.rcode, c.addrs)
		}
		s := r.String()
		for _, want := range c.printed {
			if !strings.Contains(s, want) {
				t.Errorf("%s: printed\n%s\nwithout %q", c.name, s, want)
			}
		}
		for _, not := range c.unprinted {
			if strings.Contains(s, not) {
				t.Errorf("%s: printed\n%s\nwith %q", c.name, s, not)
			}
		}
	}
	if got, want := u.Asked(), []string{"www.outside.example.", "ratings.bookinfo.svc.cluster.local."}; !slices.Equal(got, want) {
		t.Errorf("upstream asked %v, want %v", got, want)
	}
}

func TestQueryErrors(t *testing.T) {
	if _, err := Query(t.Context(), "127.0.0.1:53", "bad..name"); err == nil || !strings.Contains(err.Error(), "bad..name") {
		t.Errorf("malformed name: %v, want an error naming it", err)
	}
}

func TestStringAuthoritative(t *testing.T) {
	r := Response{Server: "127.0.0.1:15053", Question: "productpage.bookinfo.svc.cluster.local.",
		Header:  dnsmessage.Header{ID: 7, Response: true, Authoritative: true, RecursionDesired: true},
		Answers: []Record{{Name: "productpage.bookinfo.svc.cluster.local.", TTL: 30, Addr: netip.MustParseAddr("10.0.0.12")}},
		Counts:  [4]int{1, 1, 0, 0}}
	want := `;; ->>HEADER<<- opcode: QUERY, status: NOERROR, id: 7
;; flags: qr aa rd; QUERY: 1, ANSWER: 1, AUTHORITY: 0, ADDITIONAL: 0

;; QUESTION SECTION:
;productpage.bookinfo.svc.cluster.local.		IN	A

;; ANSWER SECTION:
productpage.bookinfo.svc.cluster.local.	30	IN	A	10.0.0.12

;; SERVER: 127.0.0.1#15053(127.0.0.1) (UDP)
`
	if got := r.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if got := Command(r.Server, "productpage.bookinfo.svc.cluster.local"); got != "dig @127.0.0.1 -p 15053 productpage.bookinfo.svc.cluster.local" {
		t.Errorf("Command: %q", got)
	}
}
