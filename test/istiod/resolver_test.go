package istiod

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/onboarding/agent/hostdns"
	"github.com/embark-mesh/embark/test/resolved"
)

// The VM's own resolver, Debian's real systemd-resolved, configured by
// hostdns with the real ip and resolvectl as the agent's root service does
// (dns-on), in front of the real pilot-agent connected through Embark's
// relay to istiod. The VM also has servers of its own: a global DNS= an
// operator set in resolved.conf and an uplink's (DHCP's), both the test's
// resolvers in the VM's network, which answer NXDOMAIN under cluster.local.
// Measured through the VM's stub (127.0.0.53), as its programs ask:
//   - before dns-on, mesh names do not resolve (resolved refuses names
//     under .local that no link routes: mDNS's domain) and the sidecar is
//     asked nothing;
//   - after, a Service's name answers its ClusterIP and a ServiceEntry host
//     under a configured domain its address, from the sidecar, every time
//     (the operator's global server does not share the sidecar's scope);
//   - names outside the mesh domains never reach the sidecar: the uplink
//     answers them;
//   - with the sidecar gone (relay closed), names outside the mesh keep
//     resolving, every one;
//   - dns-off deletes the link: mesh names no longer resolve.
func TestVMResolverAsksTheSidecarForMeshNamesOnly(t *testing.T) {
	ns := env.Namespace(t)
	wg := ratingsGroup(t, ns)
	declared := &istionetworkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "declared", Namespace: ns}, Spec: istioapi.ServiceEntry{
		Hosts: []string{"api.declared.example"}, Addresses: []string{"10.20.30.41"}, Location: istioapi.ServiceEntry_MESH_EXTERNAL,
		Resolution: istioapi.ServiceEntry_DNS, Ports: []*istioapi.ServicePort{{Number: 443, Name: "tls", Protocol: "TLS"}},
	}}
	if err := env.Client.Create(t.Context(), declared); err != nil {
		t.Fatal(err)
	}
	ratings := &corev1.Service{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "ratings"}, ratings); err != nil {
		t.Fatal(err)
	}
	svcName, svcIP := "ratings."+ns+".svc.cluster.local", netip.MustParseAddr(ratings.Spec.ClusterIP)

	up := startUpstream(t)
	ep := startEndpoint(t, ns)
	agent, dnsAddr := startDNSSidecar(t, ep, register(t, wg, 41), up)
	askForNameTable(t, agent)
	if a, _, ok := waitAnswer(t, dnsAddr, svcName, 60*time.Second, resolvesTo(svcIP)); !ok {
		t.Fatalf("the sidecar itself: %s: %v, want %s\n%s", svcName, a, svcIP, agent.Logs())
	}

	operator, uplink := netip.MustParseAddr("127.0.0.77"), netip.MustParseAddr("127.0.0.78")
	vm := resolved.Start(t, resolved.Options{GlobalDNS: []string{operator.String()}, UplinkDNS: []string{uplink.String()}})
	servers := map[string]*testResolver{}
	for name, addr := range map[string]netip.Addr{"operator": operator, "uplink": uplink} {
		pc, err := vm.ListenPacket("udp", netip.AddrPortFrom(addr, 53).String())
		if err != nil {
			t.Fatal(err)
		}
		servers[name] = serveResolver(t, pc, addr)
	}
	// pilot-agent runs in the test's network namespace, resolved in the
	// VM's: the relay joins them at the sidecar's address on the VM.
	relay, err := vm.RelayUDP("127.0.0.1:15053", dnsAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = relay.Close() })

	stub := func(name string, check func(answer) bool) (answer, bool) {
		t.Helper()
		a, _, ok := waitAnswerVia(t, vm.Dial, resolved.Stub, name, 10*time.Second, check)
		return a, ok
	}
	unresolved := func(a answer) bool { return a.rcode != dnsmessage.RCodeSuccess && len(a.addrs) == 0 }
	theirs := func(name string) int { return servers["operator"].asked(name) + servers["uplink"].asked(name) }

	if a, ok := stub(svcName, unresolved); !ok {
		t.Errorf("before dns-on: %s: %v, want no answer", svcName, a)
	}
	if n := relay.Asked(svcName); n != 0 {
		t.Errorf("before dns-on the sidecar was asked for %s %d times", svcName, n)
	}

	link, err := hostdns.NewLink(hostdns.DefaultLinkName, hostdns.DefaultLinkAddress, "127.0.0.1:15053", []string{"cluster.local", "declared.example"})
	if err != nil {
		t.Fatal(err)
	}
	opts := hostdns.Options{Run: vm.Run, LegacyDropIn: filepath.Join(t.TempDir(), "none.conf")}
	if created, err := hostdns.Enable(t.Context(), opts, link); err != nil || !created {
		t.Fatalf("dns-on: created=%v, %v", created, err)
	}
	if out, err := vm.Run(t.Context(), "resolvectl", "status", link.Name); err == nil {
		t.Logf("resolvectl status %s:\n%s", link.Name, out)
	}

	before := theirs(svcName)
	for i := range 10 { // every time, not once: resolved picks no other scope
		if a, ok := stub(svcName, resolvesTo(svcIP)); !ok {
			t.Fatalf("after dns-on, query %d: %s: %v, want %s", i, svcName, a, svcIP)
		}
	}
	if a, ok := stub("api.declared.example", resolvesTo(netip.MustParseAddr("10.20.30.41"))); !ok {
		t.Errorf("after dns-on: api.declared.example: %v, want 10.20.30.41", a)
	}
	if relay.Asked(svcName) == 0 {
		t.Errorf("%s answered without asking the sidecar", svcName)
	}
	if n := theirs(svcName) - before; n != 0 {
		t.Errorf("after dns-on the VM's own servers were asked for %s %d times (the operator's %d, the uplink's %d)",
			svcName, n, servers["operator"].asked(svcName), servers["uplink"].asked(svcName))
	}

	// Names outside the mesh domains: the VM's servers, never the sidecar.
	for _, name := range []string{"www.outside.example", "repo.corp.example", "cluster.local.example"} {
		if a, ok := stub(name, resolvesTo(upstreamAnswer)); !ok {
			t.Errorf("%s: %v, want the VM's servers' %s", name, a, upstreamAnswer)
		}
		if n := relay.Asked(name); n != 0 {
			t.Errorf("the sidecar was asked for %s, a name outside the mesh, %d times", name, n)
		}
	}

	// A Service created after the VM joined resolves through the VM's
	// resolver within seconds; once deleted it stops resolving as soon as
	// the sidecar's name table drops it: resolved caches nothing a server on
	// the host answers (CacheFromLocalhost=no, its default), and the test
	// allows 45 s, more than the name table's TTL, in case a host caches.
	late := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "late", Namespace: ns}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": "late"},
		Ports:    []corev1.ServicePort{{Name: "http", Port: 8080, TargetPort: intstr.FromInt32(8080)}},
	}}
	if err := env.Client.Create(t.Context(), late); err != nil {
		t.Fatal(err)
	}
	lateName := "late." + ns + ".svc.cluster.local"
	if a, took, ok := waitAnswerVia(t, vm.Dial, resolved.Stub, lateName, 15*time.Second, resolvesTo(netip.MustParseAddr(late.Spec.ClusterIP))); !ok {
		t.Errorf("new Service %s through the VM's resolver: %v after %v, want %s", lateName, a, took.Round(time.Millisecond), late.Spec.ClusterIP)
	} else {
		t.Logf("new Service %s resolves through the VM's resolver after %v", lateName, took.Round(time.Millisecond))
	}
	if err := env.Client.Delete(t.Context(), late); err != nil {
		t.Fatal(err)
	}
	if a, took, ok := waitAnswerVia(t, vm.Dial, resolved.Stub, lateName, 45*time.Second, unresolved); !ok {
		t.Errorf("deleted Service %s through the VM's resolver: %v after %v, want no answer", lateName, a, took.Round(time.Millisecond))
	} else {
		t.Logf("deleted Service %s stops resolving through the VM's resolver after %v: %v", lateName, took.Round(time.Millisecond), a)
	}

	// The sidecar gone: names outside the mesh keep resolving, every one.
	_ = relay.Close()
	failed := 0
	for i := range 20 {
		a, err := queryAVia(t.Context(), vm.Dial, resolved.Stub, "gone"+string(rune('a'+i))+".outside.example")
		if err != nil || !resolvesTo(upstreamAnswer)(a) {
			failed++
		}
	}
	if failed != 0 {
		t.Errorf("with the sidecar gone, %d of 20 names outside the mesh did not resolve", failed)
	}

	if removed, err := hostdns.Disable(t.Context(), opts, link); err != nil || !removed {
		t.Fatalf("dns-off: removed=%v, %v", removed, err)
	}
	if out, err := vm.Run(t.Context(), "ip", "-o", "link", "show"); err != nil || hostdns.Links(out)[link.Name] != "" || strings.Contains(string(out), link.Name) {
		t.Errorf("after dns-off the VM still has %s (%v):\n%s", link.Name, err, out)
	}
	if a, ok := stub(svcName, unresolved); !ok {
		t.Errorf("after dns-off: %s: %v, want no answer", svcName, a)
	}
	if n := relay.Asked(svcName); n == 0 {
		t.Error("the relay lost count")
	}
}
