package istiod

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"golang.org/x/net/dns/dnsmessage"
	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/onboarding/agent/hostdns"
	"github.com/embark-mesh/embark/onboarding/agent/sidecar"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/test/freeport"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/meshkit"
)

// upstreamAnswer is what the test's upstream resolver answers for every
// name outside cluster.local.
var upstreamAnswer = netip.MustParseAddr("192.0.2.77")

// upstream is a DNS server of the test's own on a loopback address, port
// 53 (resolv.conf has no port syntax): the VM's usual resolver. It answers
// NXDOMAIN under cluster.local, as a VPC resolver does, and upstreamAnswer
// for any other name, and records every name it is asked.
type testResolver struct {
	addr netip.Addr
	mu   sync.Mutex
	seen map[string]int
}

func startUpstream(t *testing.T) *testResolver {
	t.Helper()
	var pc net.PacketConn
	var err error
	var addr netip.Addr
	for range 20 { // a loopback address no other test run holds
		addr = netip.AddrFrom4([4]byte{127, 53, byte(1 + rand.IntN(250)), byte(1 + rand.IntN(250))})
		if pc, err = net.ListenPacket("udp", netip.AddrPortFrom(addr, 53).String()); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("upstream resolver: listen on a loopback address, port 53 (needs root or CAP_NET_BIND_SERVICE): %v", err)
	}
	return serveResolver(t, pc, addr)
}

// serveResolver serves pc (bound to addr, port 53) as a testResolver.
func serveResolver(t *testing.T, pc net.PacketConn, addr netip.Addr) *testResolver {
	u := &testResolver{addr: addr, seen: map[string]int{}}
	t.Cleanup(func() { _ = pc.Close() })
	go u.serve(pc)
	return u
}

func (u *testResolver) serve(pc net.PacketConn) {
	buf := make([]byte, 4096)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		var p dnsmessage.Parser
		h, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		name := strings.ToLower(q.Name.String())
		u.mu.Lock()
		u.seen[name]++
		u.mu.Unlock()
		switch {
		case strings.HasPrefix(name, "slow."): // never answers
			continue
		case strings.HasPrefix(name, "malformed."): // the query's ID, then garbage
			junk := make([]byte, 300)
			for i := range junk {
				junk[i] = byte(rand.Uint32())
			}
			junk[0], junk[1], junk[2] = byte(h.ID>>8), byte(h.ID), 0x80
			_, _ = pc.WriteTo(junk, from)
			continue
		}
		rh := dnsmessage.Header{ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
		if strings.HasSuffix(name, ".cluster.local.") {
			rh.RCode = dnsmessage.RCodeNameError
		}
		b := dnsmessage.NewBuilder(nil, rh)
		_ = b.StartQuestions()
		_ = b.Question(q)
		_ = b.StartAnswers()
		if rh.RCode == dnsmessage.RCodeSuccess && q.Type == dnsmessage.TypeA {
			n := 1
			if strings.HasPrefix(name, "huge.") { // some 8 KiB over UDP
				n = 500
			}
			for i := range n {
				a := upstreamAnswer.As4()
				if i > 0 {
					a = [4]byte{198, 51, byte(i >> 8), byte(i)}
				}
				_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 30}, dnsmessage.AResource{A: a})
			}
		}
		if out, err := b.Finish(); err == nil {
			_, _ = pc.WriteTo(out, from)
		}
	}
}

func (u *testResolver) asked(name string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seen[strings.ToLower(name)+"."]
}

// answer is a DNS response to an A query.
type answer struct {
	rcode         dnsmessage.RCode
	authoritative bool
	addrs         []netip.Addr
}

func (a answer) String() string {
	return fmt.Sprintf("%v authoritative=%v %v", a.rcode, a.authoritative, a.addrs)
}

// dialFunc dials a DNS server: from the test's network namespace, or a
// VM's.
type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// queryA asks server (ip:port) for name's A records over UDP, once.
func queryA(ctx context.Context, server, name string) (answer, error) {
	var d net.Dialer
	return queryAVia(ctx, d.DialContext, server, name)
}

// queryAVia is queryA through dial.
func queryAVia(ctx context.Context, dial dialFunc, server, name string) (answer, error) {
	q, err := dnsmessage.NewName(name + ".")
	if err != nil {
		return answer{}, err
	}
	id := uint16(rand.Uint32())
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: q, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	msg, err := b.Finish()
	if err != nil {
		return answer{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := dial(ctx, "udp", server)
	if err != nil {
		return answer{}, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := conn.Write(msg); err != nil {
		return answer{}, err
	}
	buf := make([]byte, 65535)
	n, err := conn.Read(buf)
	if err != nil {
		return answer{}, err
	}
	var p dnsmessage.Parser
	h, err := p.Start(buf[:n])
	if err != nil {
		return answer{}, err
	}
	if h.ID != id {
		return answer{}, fmt.Errorf("response ID %d, want %d", h.ID, id)
	}
	out := answer{rcode: h.RCode, authoritative: h.Authoritative}
	_ = p.SkipAllQuestions()
	for {
		rh, err := p.AnswerHeader()
		if err != nil {
			break
		}
		if rh.Type != dnsmessage.TypeA {
			_ = p.SkipAnswer()
			continue
		}
		a, err := p.AResource()
		if err != nil {
			break
		}
		out.addrs = append(out.addrs, netip.AddrFrom4(a.A))
	}
	return out, nil
}

// waitAnswer polls server for name until check accepts the answer or
// timeout passes, and returns the last answer and how long it took.
func waitAnswer(t *testing.T, server, name string, timeout time.Duration, check func(answer) bool) (answer, time.Duration, bool) {
	t.Helper()
	var d net.Dialer
	return waitAnswerVia(t, d.DialContext, server, name, timeout, check)
}

// waitAnswerVia is waitAnswer through dial.
func waitAnswerVia(t *testing.T, dial dialFunc, server, name string, timeout time.Duration, check func(answer) bool) (answer, time.Duration, bool) {
	t.Helper()
	start := time.Now()
	var last answer
	for time.Since(start) < timeout {
		a, err := queryAVia(t.Context(), dial, server, name)
		if err == nil {
			last = a
			if check(a) {
				return a, time.Since(start), true
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return last, time.Since(start), false
}

func resolvesTo(want netip.Addr) func(answer) bool {
	return func(a answer) bool {
		return a.rcode == dnsmessage.RCodeSuccess && len(a.addrs) == 1 && a.addrs[0] == want
	}
}

// dnsEnv is the DNS part of the cluster.env the onboarding agent renders
// for a sidecar whose DNS proxy listens on addr, with auto-allocation.
func dnsEnv(t *testing.T, addr string) map[string]string {
	t.Helper()
	env, err := sidecar.ClusterEnv(sidecar.Identity{Namespace: "ns", RegistrationName: "vm"}, &onboardingv1alpha1.SidecarBootstrap{},
		sidecar.EnvOptions{DNSAddress: addr, DNSAutoAllocate: true})
	if err != nil {
		t.Fatal(err)
	}
	vars, err := sidecar.ParseClusterEnv(env)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, k := range []string{"ISTIO_META_DNS_CAPTURE", "ISTIO_META_DNS_AUTO_ALLOCATE", "DNS_PROXY_ADDR"} {
		if vars[k] == "" {
			t.Fatalf("cluster.env lacks %s", k)
		}
		out[k] = vars[k]
	}
	return out
}

// The VM's real pilot-agent, started with the DNS settings the onboarding
// agent writes into cluster.env, connected to Embark in istiod mode, answers
// the mesh's names from the name table istiod sends it through Embark's
// relay: a Service's name with its ClusterIP, a ServiceEntry host with its
// declared address and one without addresses with the address istiod
// allocated; a name outside the mesh is answered by the VM's usual resolver
// (the test's own, on loopback, named by the resolv.conf pilot-agent reads),
// not by the sidecar; a Service created after the VM joined resolves within
// seconds, and once deleted it no longer does. The onboarding agent's
// readiness probe (hostdns.Ready) says not ready before the name table
// arrives and ready after.
func TestMeshNamesResolveOnTheVM(t *testing.T) {
	ns := env.Namespace(t)
	wg := ratingsGroup(t, ns)
	declared := &istionetworkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "declared", Namespace: ns}, Spec: istioapi.ServiceEntry{
		Hosts: []string{"api.declared.example"}, Addresses: []string{"10.20.30.40"}, Location: istioapi.ServiceEntry_MESH_EXTERNAL,
		Resolution: istioapi.ServiceEntry_DNS, Ports: []*istioapi.ServicePort{{Number: 443, Name: "tls", Protocol: "TLS"}},
	}}
	auto := &istionetworkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "auto", Namespace: ns}, Spec: istioapi.ServiceEntry{
		Hosts: []string{"auto.allocated.example"}, Location: istioapi.ServiceEntry_MESH_EXTERNAL,
		Resolution: istioapi.ServiceEntry_DNS, Ports: []*istioapi.ServicePort{{Number: 443, Name: "tls", Protocol: "TLS"}},
	}}
	for _, se := range []*istionetworkingv1.ServiceEntry{declared, auto} {
		if err := env.Client.Create(t.Context(), se); err != nil {
			t.Fatal(err)
		}
	}
	ratings := &corev1.Service{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "ratings"}, ratings); err != nil {
		t.Fatal(err)
	}
	ratingsIP := netip.MustParseAddr(ratings.Spec.ClusterIP)

	up := startUpstream(t)
	ep := startEndpoint(t, ns)
	agent, dnsAddr := startDNSSidecar(t, ep, register(t, wg, 21), up)
	probe := "istio-agent-probe.cluster.local"
	// Before anything asks istiod, pilot-agent has no name table: it
	// answers SERVFAIL, and the onboarding agent leaves the host's resolver
	// alone.
	if a, _, ok := waitAnswer(t, dnsAddr, "ratings."+ns+".svc.cluster.local", 10*time.Second, func(a answer) bool { return a.rcode == dnsmessage.RCodeServerFailure }); !ok {
		t.Fatalf("before the name table: %v, want SERVFAIL\n%s", a, agent.Logs())
	}
	if hostdns.Ready(t.Context(), dnsAddr, probe, time.Second) {
		t.Error("hostdns.Ready: ready before the name table arrived")
	}

	askForNameTable(t, agent)

	svcName := "ratings." + ns + ".svc.cluster.local"
	if a, took, ok := waitAnswer(t, dnsAddr, svcName, 60*time.Second, resolvesTo(ratingsIP)); !ok {
		t.Fatalf("%s: %v, want %s\n%s", svcName, a, ratingsIP, agent.Logs())
	} else {
		t.Logf("%s -> %v after %v", svcName, a, took.Round(time.Millisecond))
		if !a.authoritative {
			t.Errorf("%s: answer not authoritative: not the sidecar's own", svcName)
		}
	}
	if !hostdns.Ready(t.Context(), dnsAddr, probe, 2*time.Second) {
		t.Error("hostdns.Ready: not ready with the name table")
	}
	if n := up.asked(svcName); n != 0 {
		t.Errorf("the upstream resolver was asked for %s %d times: the sidecar should answer it", svcName, n)
	}

	for _, c := range []struct {
		name  string
		check func(answer) bool
		want  string
	}{
		{"api.declared.example", resolvesTo(netip.MustParseAddr("10.20.30.40")), "the declared address 10.20.30.40"},
		{"auto.allocated.example", func(a answer) bool {
			return a.rcode == dnsmessage.RCodeSuccess && len(a.addrs) == 1 && netip.MustParsePrefix("240.240.0.0/16").Contains(a.addrs[0])
		}, "an address istiod allocated (240.240.0.0/16)"},
	} {
		a, _, ok := waitAnswer(t, dnsAddr, c.name, 30*time.Second, c.check)
		if !ok {
			t.Errorf("ServiceEntry host %s: %v, want %s", c.name, a, c.want)
			continue
		}
		t.Logf("%s -> %v", c.name, a)
		if n := up.asked(c.name); n != 0 {
			t.Errorf("the upstream resolver was asked for %s: the sidecar should answer it", c.name)
		}
	}

	// A name outside the mesh: the upstream resolver answers it, through the
	// sidecar, not the sidecar itself.
	outside := "www.outside.example"
	if a, _, ok := waitAnswer(t, dnsAddr, outside, 10*time.Second, resolvesTo(upstreamAnswer)); !ok {
		t.Errorf("%s: %v, want the upstream's %s", outside, a, upstreamAnswer)
	} else if up.asked(outside) == 0 {
		t.Errorf("%s answered %v without asking the upstream resolver", outside, a)
	}

	// A Service created after the VM joined resolves within seconds; once
	// deleted, its name falls through to the upstream, which does not know it.
	late := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "late", Namespace: ns}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": "late"},
		Ports:    []corev1.ServicePort{{Name: "http", Port: 8080, TargetPort: intstr.FromInt32(8080)}},
	}}
	if err := env.Client.Create(t.Context(), late); err != nil {
		t.Fatal(err)
	}
	lateName := "late." + ns + ".svc.cluster.local"
	if a, took, ok := waitAnswer(t, dnsAddr, lateName, 15*time.Second, resolvesTo(netip.MustParseAddr(late.Spec.ClusterIP))); !ok {
		t.Errorf("new Service %s: %v after %v, want %s", lateName, a, took.Round(time.Millisecond), late.Spec.ClusterIP)
	} else {
		t.Logf("new Service %s resolves after %v", lateName, took.Round(time.Millisecond))
	}
	if err := env.Client.Delete(t.Context(), late); err != nil {
		t.Fatal(err)
	}
	if a, took, ok := waitAnswer(t, dnsAddr, lateName, 15*time.Second, func(a answer) bool { return a.rcode == dnsmessage.RCodeNameError }); !ok {
		t.Errorf("deleted Service %s: %v after %v, want NXDOMAIN", lateName, a, took.Round(time.Millisecond))
	} else {
		t.Logf("deleted Service %s stops resolving after %v", lateName, took.Round(time.Millisecond))
	}
}

// freeUDPAddr is a loopback UDP address nothing listens on (pilot-agent's
// DNS proxy binds UDP and TCP there).
func freeUDPAddr(t *testing.T) string {
	t.Helper()
	return freeport.MustDNSAddr(t)
}

// startDNSSidecar starts the VM's real pilot-agent for vm, connected to ep,
// with the DNS settings the onboarding agent renders (its DNS proxy on a
// free loopback port) and up as the VM's resolver; it returns the agent and
// the proxy's address.
func startDNSSidecar(t *testing.T, ep *endpoint, vm *workload, up *testResolver) (*istioagent.Agent, string) {
	t.Helper()
	dnsAddr := freeUDPAddr(t)
	agent := meshkit.StartSidecar(t, ep.xds, ep.rootFile, vm.VM, istioagent.Options{
		Env:        dnsEnv(t, dnsAddr),
		ResolvConf: fmt.Appendf(nil, "nameserver %s\n", up.addr),
	})
	return agent, dnsAddr
}

// askForNameTable plays Envoy's first LDS request, which makes pilot-agent
// ask istiod (through Embark) for the name table.
func askForNameTable(t *testing.T, agent *istioagent.Agent) {
	t.Helper()
	envoy, err := istioagent.Connect(t.Context(), agent)
	if err != nil {
		t.Fatal(err)
	}
	if err := envoy.Send(resource.ListenerType, nil, "", ""); err != nil {
		t.Fatal(err)
	}
}

// Bad input around the VM's names: the sidecar's DNS proxy gets a huge, a
// malformed and no answer from the upstream resolver, and a flood of
// queries from the VM; a second sidecar never gets its name table. Measured:
// the sidecar keeps running and keeps answering mesh and outside names, the
// outside names keep resolving through the VM's own resolver during the
// flood, and a sidecar without a name table (which answers every name
// SERVFAIL) is never reported ready, so the onboarding agent never points
// the host's resolver at it.
func TestMeshDNSBadInput(t *testing.T) {
	ns := env.Namespace(t)
	wg := ratingsGroup(t, ns)
	ratings := &corev1.Service{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "ratings"}, ratings); err != nil {
		t.Fatal(err)
	}
	ratingsName, ratingsIP := "ratings."+ns+".svc.cluster.local", netip.MustParseAddr(ratings.Spec.ClusterIP)
	up := startUpstream(t)
	upAddr := netip.AddrPortFrom(up.addr, 53).String()
	ep := startEndpoint(t, ns)
	agent, dnsAddr := startDNSSidecar(t, ep, register(t, wg, 31), up)
	askForNameTable(t, agent)
	if a, _, ok := waitAnswer(t, dnsAddr, ratingsName, 60*time.Second, resolvesTo(ratingsIP)); !ok {
		t.Fatalf("%s: %v, want %s\n%s", ratingsName, a, ratingsIP, agent.Logs())
	}
	stillServes := func(after string) {
		t.Helper()
		if !agent.Running() {
			t.Fatalf("after %s: pilot-agent is not running\n%s", after, agent.Logs())
		}
		for _, c := range []struct {
			name string
			want netip.Addr
		}{{ratingsName, ratingsIP}, {"www.outside.example", upstreamAnswer}} {
			if a, _, ok := waitAnswer(t, dnsAddr, c.name, 5*time.Second, resolvesTo(c.want)); !ok {
				t.Errorf("after %s: %s: %v, want %s", after, c.name, a, c.want)
			}
		}
	}

	// Bad upstream answers: each costs the VM that name only.
	for _, c := range []struct {
		name  string
		check func(answer, error) bool
		want  string
	}{
		{"huge.outside.example", func(a answer, err error) bool { return err == nil && len(a.addrs) <= 64 }, "at most what fits one UDP answer (cut, or refused)"},
		{"malformed.outside.example", func(a answer, err error) bool { return err != nil || len(a.addrs) == 0 }, "no address"},
		{"slow.outside.example", func(a answer, err error) bool { return err != nil || a.rcode != dnsmessage.RCodeSuccess }, "no address"},
	} {
		a, err := queryA(t.Context(), dnsAddr, c.name)
		t.Logf("%s: %v (%v)", c.name, a, err)
		if !c.check(a, err) {
			t.Errorf("%s: %v, %v; want %s", c.name, a, err, c.want)
		}
		if up.asked(c.name) == 0 {
			t.Errorf("%s: the upstream resolver was not asked", c.name)
		}
		stillServes(c.name)
	}

	// A flood from the VM: 8 senders as fast as they can for 3 s, each
	// query a new outside name (nothing cached). Meanwhile the VM's
	// resolver answers an outside name, and the sidecar a mesh name.
	floodCtx, stop := context.WithTimeout(t.Context(), 3*time.Second)
	defer stop()
	var sent, answered atomic.Int64
	var wgFlood sync.WaitGroup
	for g := range 8 {
		wgFlood.Add(1)
		go func() {
			defer wgFlood.Done()
			for i := 0; floodCtx.Err() == nil; i++ {
				sent.Add(1)
				if _, err := queryA(floodCtx, dnsAddr, fmt.Sprintf("flood-%d-%d.outside.example", g, i)); err == nil {
					answered.Add(1)
				}
			}
		}()
	}
	var meshDuring, viaSidecarDuring, outsideDuring []time.Duration
	for floodCtx.Err() == nil {
		start := time.Now()
		if a, err := queryA(t.Context(), dnsAddr, ratingsName); err == nil && resolvesTo(ratingsIP)(a) {
			meshDuring = append(meshDuring, time.Since(start))
		}
		start = time.Now()
		if a, err := queryA(t.Context(), dnsAddr, "www.outside.example"); err == nil && resolvesTo(upstreamAnswer)(a) {
			viaSidecarDuring = append(viaSidecarDuring, time.Since(start))
		}
		start = time.Now()
		if a, err := queryA(t.Context(), upAddr, "www.outside.example"); err == nil && resolvesTo(upstreamAnswer)(a) {
			outsideDuring = append(outsideDuring, time.Since(start))
		}
		time.Sleep(100 * time.Millisecond)
	}
	wgFlood.Wait()
	t.Logf("flood: %d queries sent, %d answered; during it the sidecar answered %s %d times (slowest %v) and forwarded www.outside.example %d times (slowest %v), the VM's resolver answered it %d times (slowest %v)",
		sent.Load(), answered.Load(), ratingsName, len(meshDuring), slowest(meshDuring), len(viaSidecarDuring), slowest(viaSidecarDuring),
		len(outsideDuring), slowest(outsideDuring))
	if len(viaSidecarDuring) == 0 {
		t.Error("during the flood the sidecar forwarded no outside name")
	}
	if len(outsideDuring) == 0 {
		t.Error("during the flood the VM's resolver answered no outside name")
	}
	if len(meshDuring) == 0 {
		t.Error("during the flood the sidecar answered no mesh name")
	}
	stillServes("the flood")

	// A sidecar whose name table never arrives (nothing asks istiod for
	// it): it answers every name SERVFAIL, outside names included, so the
	// host's resolver must never be pointed at it: hostdns.WaitReady, the
	// agent's gate, never returns ready.
	stale, staleAddr := startDNSSidecar(t, ep, register(t, wg, 32), up)
	if a, _, ok := waitAnswer(t, staleAddr, "www.outside.example", 10*time.Second, func(a answer) bool { return a.rcode == dnsmessage.RCodeServerFailure }); !ok {
		t.Errorf("a sidecar without its name table answered www.outside.example %v, want SERVFAIL", a)
	}
	waitCtx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := hostdns.WaitReady(waitCtx, staleAddr, "istio-agent-probe.cluster.local", 500*time.Millisecond); err == nil {
		t.Errorf("hostdns.WaitReady: a sidecar without its name table is ready\n%s", stale.Logs())
	}
	if a, err := queryA(t.Context(), upAddr, "www.outside.example"); err != nil || !resolvesTo(upstreamAnswer)(a) {
		t.Errorf("the VM's own resolver: %v, %v", a, err)
	}
}

func slowest(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m.Round(time.Millisecond)
}
