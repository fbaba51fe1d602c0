// Package parity compares what standalone translation (translate/) serves a
// VM with what a real istiod generates for the same VM from the same
// objects. See docs/translate.md ("Parity with istiod") for the facts
// compared and the documented, intentional differences.
package parity

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/embark-mesh/embark/test/adsclient"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/testenv"
	"github.com/embark-mesh/embark/translate"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}, &env) }

// vmIP is the VM's address, outside the test API server's Service range
// (10.0.0.0/24) so no cluster IP collides with it.
const vmIP = "172.16.0.10"

// world is the objects both sides read.
type world struct {
	ns       string
	sidecar  *istionetworkingv1.Sidecar
	services []*corev1.Service
	slices   []*discoveryv1.EndpointSlice
	pods     []*corev1.Pod
	entries  []*istionetworkingv1.WorkloadEntry
	labels   map[string]string
}

// seed004World is the example ratings VM (WorkloadGroup template labels
// app=ratings class=vm, service account ratings) with its Sidecar, a
// ratings Service selecting it, and details and reviews Services backed by
// pods of their own service accounts.
func seed004World(ns string) *world {
	w := &world{ns: ns, labels: map[string]string{"app": "ratings", "class": "vm"}}
	w.sidecar = &istionetworkingv1.Sidecar{ObjectMeta: metav1.ObjectMeta{Name: "bookinfo-ratings-no-iptables", Namespace: ns}}
	w.sidecar.Spec.WorkloadSelector = &istioapi.WorkloadSelector{Labels: w.labels}
	w.sidecar.Spec.Ingress = []*istioapi.IstioIngressListener{{
		DefaultEndpoint: "127.0.0.1:8080",
		Port:            &istioapi.SidecarPort{Name: "http", Number: 8080, Protocol: "HTTP"},
	}}
	w.sidecar.Spec.Egress = []*istioapi.IstioEgressListener{{
		Bind:  "127.0.0.2",
		Port:  &istioapi.SidecarPort{Name: "http", Number: 8080, Protocol: "HTTP"},
		Hosts: []string{"./*"},
	}}
	for i, app := range []string{"details", "reviews"} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: ns}}
		svc.Spec.Selector = map[string]string{"app": app}
		svc.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 8080}}
		w.services = append(w.services, svc)
		ip := fmt.Sprintf("10.244.0.%d", 20+i)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: app + "-v1-0", Namespace: ns, Labels: map[string]string{"app": app}}}
		pod.Spec.ServiceAccountName = "bookinfo-" + app
		pod.Spec.Containers = []corev1.Container{{Name: app, Image: app}}
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		w.pods = append(w.pods, pod)
		w.slices = append(w.slices, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: app + "-abc", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: app}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(9080)), Protocol: ptr.To(corev1.ProtocolTCP)}},
			Endpoints: []discoveryv1.Endpoint{{
				Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: pod.Name, Namespace: ns},
			}},
		})
	}
	ratings := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: ns}}
	ratings.Spec.Selector = map[string]string{"app": "ratings"}
	ratings.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 8080}}
	w.services = append(w.services, ratings)
	we := &istionetworkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: "ratings-vm-1", Namespace: ns}}
	we.Spec.Address = vmIP
	we.Spec.Labels = w.labels
	we.Spec.ServiceAccount = "ratings"
	w.entries = append(w.entries, we)
	return w
}

func (w *world) create(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	objs := []client.Object{w.sidecar}
	for _, s := range w.services {
		objs = append(objs, s)
	}
	for _, s := range w.slices {
		objs = append(objs, s)
	}
	for _, e := range w.entries {
		objs = append(objs, e)
	}
	for _, sa := range []string{"ratings", "bookinfo-details", "bookinfo-reviews"} {
		objs = append(objs, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: w.ns}})
	}
	for _, o := range objs {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	for _, p := range w.pods {
		status := p.Status
		if err := env.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		p.Status = status
		if err := env.Client.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
}

// inputs are the same objects as translate.Inputs.
func (w *world) inputs() *translate.Inputs {
	return &translate.Inputs{
		Mesh:     translate.Mesh{TrustDomain: "cluster.local", ClusterID: "Kubernetes"},
		Workload: translate.Workload{Name: "ratings-vm-1", Namespace: w.ns, Address: vmIP, Labels: w.labels, ServiceAccount: "ratings"},
		Sidecars: []*istionetworkingv1.Sidecar{w.sidecar}, Services: w.services, EndpointSlices: w.slices,
		WorkloadEntries: w.entries, Pods: w.pods, RootNamespace: testenv.IstiodNamespace,
	}
}

// node is what pilot-agent sends for the VM (no traffic capture).
func (w *world) node() *core.Node {
	labels := map[string]any{}
	for k, v := range w.labels {
		labels[k] = v
	}
	md, err := structpb.NewStruct(map[string]any{
		"NAMESPACE": w.ns, "LABELS": labels, "SERVICE_ACCOUNT": "ratings", "ISTIO_VERSION": "1.30.0",
		"CLUSTER_ID": "Kubernetes", "INTERCEPTION_MODE": "NONE", "INSTANCE_IPS": vmIP, "WORKLOAD_NAME": "ratings",
		"MESH_ID": "cluster.local", "PROXY_CONFIG": map[string]any{}, "NODE_NAME": "",
	})
	if err != nil {
		panic(err)
	}
	return &core.Node{Id: fixtures.NodeID(vmIP, k8stypes.NamespacedName{Namespace: w.ns, Name: "ratings-vm-1"}), Metadata: md}
}

// fetchIstiod asks istiod, as the VM's proxy, for CDS and LDS, then EDS and
// RDS for what they name.
func fetchIstiod(ctx context.Context, addr string, node *core.Node) (map[string][]types.Resource, error) {
	conn, err := adsclient.Dial(addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	ads, err := adsclient.OpenSotW(ctx, conn, "", node)
	if err != nil {
		return nil, err
	}
	defer ads.Close()
	out := map[string][]types.Resource{}
	get := func(typ string, names []string) error {
		if err := ads.Request(typ, names...); err != nil {
			return err
		}
		for {
			resp, err := ads.Next()
			if err != nil {
				return fmt.Errorf("%s: %w", typ, err)
			}
			if resp.GetTypeUrl() != typ {
				continue
			}
			for _, a := range resp.GetResources() {
				m, err := unmarshal(a)
				if err != nil {
					return err
				}
				out[typ] = append(out[typ], m)
			}
			return ads.ACK(resp)
		}
	}
	if err := get(resource.ClusterType, nil); err != nil {
		return nil, err
	}
	if err := get(resource.ListenerType, nil); err != nil {
		return nil, err
	}
	var eds, rds []string
	for _, r := range out[resource.ClusterType] {
		if c := r.(*clusterv3.Cluster); c.GetType() == clusterv3.Cluster_EDS {
			eds = append(eds, c.GetName())
		}
	}
	for _, r := range out[resource.ListenerType] {
		for _, fc := range r.(*listenerv3.Listener).GetFilterChains() {
			for _, f := range fc.GetFilters() {
				if hcm := hcmOf(f); hcm != nil && hcm.GetRds() != nil {
					rds = append(rds, hcm.GetRds().GetRouteConfigName())
				}
			}
		}
	}
	if len(eds) > 0 {
		if err := get(resource.EndpointType, eds); err != nil {
			return nil, err
		}
	}
	if len(rds) > 0 {
		slices.Sort(rds)
		if err := get(resource.RouteType, slices.Compact(rds)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func unmarshal(a *anypb.Any) (types.Resource, error) {
	m, err := a.UnmarshalNew()
	if err != nil {
		return nil, err
	}
	return m.(types.Resource), nil
}

func hcmOf(f *listenerv3.Filter) *hcmv3.HttpConnectionManager {
	if f.GetName() != wellknown.HTTPConnectionManager {
		return nil
	}
	hcm := &hcmv3.HttpConnectionManager{}
	if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
		return nil
	}
	return hcm
}

// facts are the normalised, traffic-relevant facts of a configuration, one
// string each, restricted to the listeners on the VM's and the Sidecar's
// binds and the clusters they use.
func facts(res map[string][]types.Resource) []string {
	clusters := map[string]*clusterv3.Cluster{}
	for _, r := range res[resource.ClusterType] {
		c := r.(*clusterv3.Cluster)
		clusters[c.GetName()] = c
	}
	cla := map[string]*endpointv3.ClusterLoadAssignment{}
	for _, r := range res[resource.EndpointType] {
		c := r.(*endpointv3.ClusterLoadAssignment)
		cla[c.GetClusterName()] = c
	}
	routes := map[string]*routev3.RouteConfiguration{}
	for _, r := range res[resource.RouteType] {
		rc := r.(*routev3.RouteConfiguration)
		routes[rc.GetName()] = rc
	}
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	usedClusters := map[string]bool{}
	for _, r := range res[resource.ListenerType] {
		l := r.(*listenerv3.Listener)
		sa := l.GetAddress().GetSocketAddress()
		bind := fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue())
		if sa.GetAddress() != vmIP && sa.GetAddress() != "127.0.0.2" {
			continue // istiod's listeners for capture modes the VM does not use
		}
		add("listener %s %s", bind, l.GetTrafficDirection())
		for _, fc := range l.GetFilterChains() {
			chain := fmt.Sprintf("listener %s chain transport=%q", bind, fc.GetFilterChainMatch().GetTransportProtocol())
			if ts := fc.GetTransportSocket(); ts != nil {
				d := &tlsv3.DownstreamTlsContext{}
				if err := ts.GetTypedConfig().UnmarshalTo(d); err == nil {
					add("%s tls %s client-cert-required=%v", chain, tlsFacts(d.GetCommonTlsContext()), d.GetRequireClientCertificate().GetValue())
				}
			}
			for _, f := range fc.GetFilters() {
				if hcm := hcmOf(f); hcm != nil {
					rc := hcm.GetRouteConfig()
					if rc == nil {
						rc = routes[hcm.GetRds().GetRouteConfigName()]
					}
					for _, vh := range rc.GetVirtualHosts() {
						for _, rt := range vh.GetRoutes() {
							c := rt.GetRoute().GetCluster()
							usedClusters[c] = true
							for _, d := range vh.GetDomains() {
								if l.GetTrafficDirection() == core.TrafficDirection_INBOUND {
									d = "*" // istiod's inbound route names the domain "*" too; only the target matters
								}
								add("%s route %s -> %s", chain, d, target(c, clusters, cla))
							}
						}
					}
				}
				if f.GetName() == wellknown.TCPProxy {
					tp := &tcpproxyv3.TcpProxy{}
					if err := f.GetTypedConfig().UnmarshalTo(tp); err == nil {
						usedClusters[tp.GetCluster()] = true
						add("%s tcp -> %s", chain, target(tp.GetCluster(), clusters, cla))
					}
				}
			}
		}
	}
	for name := range usedClusters {
		c := clusters[name]
		if c == nil || !strings.HasPrefix(name, "outbound|") {
			continue
		}
		if tls := upstreamTLS(c); tls != nil {
			add("cluster %s sni=%s %s", name, tls.GetSni(), tlsFacts(tls.GetCommonTlsContext()))
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// target is a cluster's name and its endpoint addresses.
func target(name string, clusters map[string]*clusterv3.Cluster, cla map[string]*endpointv3.ClusterLoadAssignment) string {
	c := clusters[name]
	if c == nil {
		return name + " (missing)"
	}
	la := c.GetLoadAssignment()
	if c.GetType() == clusterv3.Cluster_EDS {
		la = cla[name]
	}
	var addrs []string
	for _, le := range la.GetEndpoints() {
		for _, e := range le.GetLbEndpoints() {
			sa := e.GetEndpoint().GetAddress().GetSocketAddress()
			addrs = append(addrs, fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue()))
		}
	}
	sort.Strings(addrs)
	return fmt.Sprintf("%s%v", name, addrs)
}

// upstreamTLS is a cluster's mutual TLS: its transport socket, or istiod's
// match for endpoints labelled tlsMode=istio.
func upstreamTLS(c *clusterv3.Cluster) *tlsv3.UpstreamTlsContext {
	ts := c.GetTransportSocket()
	for _, m := range c.GetTransportSocketMatches() {
		if m.GetMatch().GetFields()["tlsMode"].GetStringValue() == "istio" {
			ts = m.GetTransportSocket()
		}
	}
	if ts == nil {
		return nil
	}
	u := &tlsv3.UpstreamTlsContext{}
	if err := ts.GetTypedConfig().UnmarshalTo(u); err != nil {
		return nil
	}
	return u
}

func tlsFacts(c *tlsv3.CommonTlsContext) string {
	var certs []string
	for _, s := range c.GetTlsCertificateSdsSecretConfigs() {
		certs = append(certs, s.GetName())
	}
	cv := c.GetCombinedValidationContext()
	var sans []string
	for _, m := range cv.GetDefaultValidationContext().GetMatchTypedSubjectAltNames() {
		b, _ := protojson.Marshal(m.GetMatcher())
		sans = append(sans, strings.ReplaceAll(string(b), " ", ""))
	}
	sort.Strings(sans)
	return fmt.Sprintf("certs=%v ca=%s alpn=%v sans=%v", certs, cv.GetValidationContextSdsSecretConfig().GetName(), c.GetAlpnProtocols(), sans)
}

// intentional are the documented differences (docs/translate.md, "Parity
// with istiod") as rewrites of istiod's facts: each maps an istiod fact to
// what standalone serves instead ("" drops it).
func intentional(f string) string {
	// istiod splits what is not Istio mutual TLS into a raw_buffer chain and
	// a TLS chain without Istio's ALPNs, both to the application; standalone
	// has one chain matching everything else. Same connections accepted.
	f = strings.Replace(f, `transport="raw_buffer"`, `transport=""`, 1)
	f = withoutSANs(f)
	switch {
	// istiod also matches the FQDN with a trailing dot ("x.ns.svc.cluster.local.");
	// standalone does not serve that form.
	case strings.Contains(f, ".svc.cluster.local. -> "):
		return ""
	// istiod's egress routes also name the Service's cluster IP; without
	// traffic capture the application addresses 127.0.0.2 by name.
	case strings.Contains(f, " route 10.") && strings.Contains(f, "listener 127.0.0.2:8080"):
		return ""
	// istiod's egress route configuration ends with a catch-all virtual
	// host to the BlackHole/Passthrough cluster; standalone answers 404.
	case strings.Contains(f, " route * -> BlackHoleCluster"), strings.Contains(f, " route * -> PassthroughCluster"),
		strings.Contains(f, "allow_any"):
		return ""
	}
	return f
}

// sansRE finds the SAN list of a cluster's TLS facts.
var sansRE = regexp.MustCompile(` sans=\[[^\]]*\]$`)

// withoutSANs drops the SAN matchers from a cluster's TLS facts: istiod
// leaves them empty here, standalone pins the destination's service accounts
// (pods' and WorkloadEntries'), so standalone refuses peers istiod would
// accept, never the reverse (docs/translate.md, "Parity with istiod").
func withoutSANs(f string) string {
	if strings.HasPrefix(f, "cluster ") {
		return sansRE.ReplaceAllString(f, "")
	}
	return f
}

// standaloneIntentional is intentional for standalone's own facts: it also
// matches "host:port" route domains, which istiod no longer generates (extra
// matches for the same destination).
func standaloneIntentional(f string) string {
	f = withoutSANs(f)
	if i := strings.Index(f, " route "); i >= 0 && strings.Contains(f, "listener 127.0.0.2:") {
		rest := f[i+len(" route "):]
		if j := strings.Index(rest, " -> "); j >= 0 && strings.Contains(rest[:j], ":") {
			return ""
		}
	}
	return f
}

func TestParityWithIstiod(t *testing.T) {
	ctx := t.Context()
	istiod, err := testenv.StartIstiod(ctx, env, testenv.IstiodOptions{})
	if err != nil {
		t.Fatalf("start istiod: %v", err)
	}
	t.Cleanup(func() { _ = istiod.Close() })
	ns := env.Namespace(t)
	w := seed004World(ns)
	w.create(t)

	res, err := translate.Translate(w.inputs())
	if err != nil {
		t.Fatal(err)
	}
	byType := map[string][]types.Resource{}
	for typ, rs := range res.ByType() {
		byType[typ] = rs
	}
	var standalone []string
	for _, f := range facts(byType) {
		if f = standaloneIntentional(f); f != "" {
			standalone = append(standalone, f)
		}
	}

	// istiod learns the objects through its informers: ask until its
	// configuration names every cluster standalone serves (or give up and
	// compare what it has).
	var fromIstiod []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := fetchIstiod(ctx, istiod.GRPCAddr, w.node())
		if err != nil {
			t.Fatalf("ask istiod as the VM's proxy: %v\nistiod log:\n%s", err, istiod.Log())
		}
		fromIstiod = nil
		for _, f := range facts(got) {
			if f = intentional(f); f != "" {
				fromIstiod = append(fromIstiod, f)
			}
		}
		if slices.Equal(fromIstiod, standalone) || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	onlyIstiod, onlyStandalone := diff(fromIstiod, standalone)
	if len(onlyIstiod)+len(onlyStandalone) > 0 {
		t.Errorf("standalone translation and istiod differ on facts that matter to traffic and are not documented as intentional:\nonly istiod:\n  %s\nonly standalone:\n  %s",
			strings.Join(onlyIstiod, "\n  "), strings.Join(onlyStandalone, "\n  "))
	}
	if len(standalone) < 6 {
		t.Errorf("too few facts compared (%d): %v", len(standalone), standalone)
	}
	t.Logf("%d facts agree:\n  %s", len(standalone), strings.Join(standalone, "\n  "))
}

func diff(a, b []string) (onlyA, onlyB []string) {
	for _, x := range a {
		if !slices.Contains(b, x) {
			onlyA = append(onlyA, x)
		}
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			onlyB = append(onlyB, x)
		}
	}
	return onlyA, onlyB
}
