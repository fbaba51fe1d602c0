package xds

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	istionetworking "istio.io/api/networking/v1"
	istiosecurity "istio.io/api/security/v1"
	istiotype "istio.io/api/type/v1beta1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istiosecurityv1 "istio.io/client-go/pkg/apis/security/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/adsclient"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/testenv"
	"github.com/embark-mesh/embark/xds/relay"
	"github.com/embark-mesh/embark/xds/upstream"
)

// The tests of istiod mode run Embark's xDS server with a relay to a real
// istiod (pilot-discovery), Istio's own pilot-agent as the VM's sidecar (its
// XDS socket read by a client playing Envoy's part: there is no Envoy binary
// here) and Istio's own istioctl against istiod.

// startIstiod runs a real istiod against the test API server until the test
// ends.
func startIstiod(t *testing.T) *testenv.Istiod {
	t.Helper()
	i, err := testenv.StartIstiod(t.Context(), env, testenv.IstiodOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("istiod log (tail):\n%s", tail(i.Log(), 60))
		}
		_ = i.Close()
	})
	return i
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// istiodRelay dials istiod's secure xDS port as the endpoint does
// (upstream.Dial: istiod's root and server name) and returns a relay over
// that connection.
func istiodRelay(t *testing.T, i *testenv.Istiod, m *relay.Metrics) *relay.Relay {
	t.Helper()
	roots := filepath.Join(t.TempDir(), "root-cert.pem")
	if err := os.WriteFile(roots, i.RootCert, 0o600); err != nil {
		t.Fatal(err)
	}
	conn, err := upstream.Dial(t.Context(), upstream.Options{
		Address: i.SecureGRPCAddr, ServerName: testenv.IstiodServerName, RootCertFile: roots,
		BackoffMax: 2 * time.Second, Logger: fixtures.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	r, err := relay.New(relay.Options{Conn: conn, MaxBackoff: 2 * time.Second, Metrics: m, Logger: fixtures.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// bookinfo creates what istiod needs to configure the ratings VM: the
// ratings and reviews Services, an AuthorizationPolicy selecting ratings, a
// VirtualService and a DestinationRule for reviews.
func bookinfo(t *testing.T, ns string) {
	t.Helper()
	svc := func(name string) *corev1.Service {
		return &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.ServiceSpec{
				Selector: map[string]string{"app": name},
				Ports:    []corev1.ServicePort{{Name: "http", Port: 9080, TargetPort: intstr.FromInt32(9080)}},
			},
		}
	}
	objs := []client.Object{
		svc("ratings"), svc("reviews"),
		&istiosecurityv1.AuthorizationPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "ratings-viewer", Namespace: ns},
			Spec: istiosecurity.AuthorizationPolicy{
				Selector: &istiotype.WorkloadSelector{MatchLabels: map[string]string{"app": "ratings"}},
				Action:   istiosecurity.AuthorizationPolicy_ALLOW,
				Rules: []*istiosecurity.Rule{{
					From: []*istiosecurity.Rule_From{{Source: &istiosecurity.Source{Principals: []string{"cluster.local/ns/" + ns + "/sa/bookinfo-reviews"}}}},
					To:   []*istiosecurity.Rule_To{{Operation: &istiosecurity.Operation{Methods: []string{"GET"}}}},
				}},
			},
		},
		&istionetworkingv1.VirtualService{
			ObjectMeta: metav1.ObjectMeta{Name: "reviews", Namespace: ns},
			Spec: istionetworking.VirtualService{
				Hosts: []string{"reviews"},
				Http: []*istionetworking.HTTPRoute{{
					Name:    "reviews-timeout",
					Timeout: durationpb.New(7 * time.Second),
					Route:   []*istionetworking.HTTPRouteDestination{{Destination: &istionetworking.Destination{Host: "reviews"}}},
				}},
			},
		},
		destinationRule(ns, 7),
	}
	for _, o := range objs {
		if err := env.Client.Create(t.Context(), o); err != nil {
			t.Fatal(err)
		}
	}
}

func destinationRule(ns string, maxConnections int32) *istionetworkingv1.DestinationRule {
	return &istionetworkingv1.DestinationRule{
		ObjectMeta: metav1.ObjectMeta{Name: "reviews", Namespace: ns},
		Spec: istionetworking.DestinationRule{
			Host: "reviews",
			TrafficPolicy: &istionetworking.TrafficPolicy{ConnectionPool: &istionetworking.ConnectionPoolSettings{
				Tcp: &istionetworking.ConnectionPoolSettings_TCPSettings{MaxConnections: maxConnections},
			}},
		},
	}
}

// envoy plays Envoy's part on pilot-agent's XDS socket: it ACKs every
// response as it arrives (istiod pushes when the mesh changes, and shows
// STALE what is not ACKed) and keeps the latest of each type.
type envoy struct {
	t *testing.T
	c *istioagent.Client

	mu   sync.Mutex
	last map[string]*discovery.DiscoveryResponse
	err  error
}

func newEnvoy(t *testing.T, c *istioagent.Client) *envoy {
	e := &envoy{t: t, c: c, last: map[string]*discovery.DiscoveryResponse{}}
	go func() {
		for {
			resp, err := c.Recv(t.Context())
			if err == nil {
				err = c.ACK(resp)
			}
			e.mu.Lock()
			if err != nil {
				e.err = err
				e.mu.Unlock()
				return
			}
			e.last[resp.GetTypeUrl()] = resp
			e.mu.Unlock()
		}
	}()
	return e
}

// latest returns the latest response of typeURL.
func (e *envoy) latest(typeURL string) *discovery.DiscoveryResponse {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.last[typeURL]
}

// waitFor waits until the latest response of typeURL satisfies ok.
func (e *envoy) waitFor(typeURL string, ok func(*discovery.DiscoveryResponse) bool) *discovery.DiscoveryResponse {
	e.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		e.mu.Lock()
		resp, err := e.last[typeURL], e.err
		e.mu.Unlock()
		if resp != nil && ok(resp) {
			return resp
		}
		if err != nil {
			e.t.Fatalf("waiting for %s: the stream ended: %v", typeURL, err)
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("waiting for %s: no satisfying response", typeURL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *envoy) subscribe(typeURL string, names ...string) *discovery.DiscoveryResponse {
	e.t.Helper()
	if err := e.c.Send(typeURL, names, "", ""); err != nil {
		e.t.Fatal(err)
	}
	return e.waitFor(typeURL, func(*discovery.DiscoveryResponse) bool { return true })
}

// subscribeAll subscribes like Envoy: CDS, then the EDS of its EDS clusters,
// LDS, then the RDS of port 9080.
func (e *envoy) subscribeAll() {
	e.t.Helper()
	cds := e.subscribe(resource.ClusterType)
	var eds []string
	for _, a := range cds.GetResources() {
		c := &cluster.Cluster{}
		if err := a.UnmarshalTo(c); err != nil {
			e.t.Fatal(err)
		}
		if c.GetType() == cluster.Cluster_EDS {
			eds = append(eds, c.GetName())
		}
	}
	if len(eds) == 0 {
		e.t.Fatal("istiod sent no EDS cluster")
	}
	e.subscribe(resource.EndpointType, eds...)
	e.subscribe(resource.ListenerType)
	e.subscribe(resource.RouteType, "9080")
}

func findCluster(t *testing.T, resp *discovery.DiscoveryResponse, name string) *cluster.Cluster {
	t.Helper()
	for _, a := range resp.GetResources() {
		c := &cluster.Cluster{}
		if err := a.UnmarshalTo(c); err != nil {
			t.Fatal(err)
		}
		if c.GetName() == name {
			return c
		}
	}
	t.Fatalf("no cluster %s in CDS", name)
	return nil
}

func maxConnections(c *cluster.Cluster) uint32 {
	for _, th := range c.GetCircuitBreakers().GetThresholds() {
		return th.GetMaxConnections().GetValue()
	}
	return 0
}

// startVM starts pilot-agent as the registered workload's sidecar against
// r, its certificate from i's CA, and plays its Envoy.
func startVM(t *testing.T, r *replica, i *testenv.Istiod, w *workload, ns string) (*istioagent.Agent, *envoy) {
	t.Helper()
	agent := istioagent.Start(t, withIstiodCA(i, istioagent.Options{
		DiscoveryAddress: r.addr,
		PodName:          w.key.Name,
		PodNamespace:     ns,
		InstanceIP:       w.ip,
		ServiceAccount:   fixtures.ServiceAccount,
		Labels:           map[string]string{"app": "ratings"},
		Token:            w.token,
	}))
	checkCertificate(t, agent, i, ns, fixtures.ServiceAccount)
	c, err := istioagent.Connect(t.Context(), agent)
	if err != nil {
		t.Fatal(err)
	}
	return agent, newEnvoy(t, c)
}

// proxyStatus runs `istioctl proxy-status` against istiod and returns the
// row of name (nil when it is not listed) under the header's columns.
func proxyStatus(t *testing.T, i *testenv.Istiod, name string, extra ...string) (map[string]string, string) {
	t.Helper()
	args := append([]string{"proxy-status", "--xds-address", i.GRPCAddr, "--plaintext", "-r", "default"}, extra...)
	out, err := istioagent.Istioctl(t.Context(), t, args...)
	if err != nil {
		t.Fatalf("istioctl %v: %v\n%s", args, err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	header := splitColumns.Split(strings.TrimSpace(lines[0]), -1)
	for _, l := range lines[1:] {
		row := splitColumns.Split(strings.TrimSpace(age.ReplaceAllString(l, "")), -1)
		if len(row) > 0 && row[0] == name {
			m := map[string]string{}
			for k, h := range header {
				if k < len(row) {
					m[h] = row[k]
				}
			}
			return m, out
		}
	}
	return nil, out
}

// waitSynced waits until istioctl lists name through istiod with CDS, LDS,
// EDS and RDS SYNCED, and returns the plain and per-type outputs.
func waitSynced(t *testing.T, i *testenv.Istiod, name string) (plain, perType string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		row, out := proxyStatus(t, i, name, "-v", "1")
		ok := row != nil
		for _, typ := range []string{"CDS", "LDS", "EDS", "RDS"} {
			ok = ok && row[typ] == "SYNCED"
		}
		if ok {
			plain, _ := proxyStatus(t, i, name)
			if plain == nil {
				t.Fatalf("istioctl proxy-status without -v does not list %s", name)
			}
			return fmt.Sprint(plain), out
		}
		if time.Now().After(deadline) {
			t.Fatalf("istioctl proxy-status through istiod never listed %s with CDS, LDS, EDS and RDS SYNCED:\n%s", name, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestIstiodModeServesIstiodConfiguration: a VM's sidecar, connected to
// Embark only, gets what istiod generates for it (RBAC from an
// AuthorizationPolicy, a VirtualService's route, a DestinationRule's
// settings), Embark keeps the connection and health, and istioctl lists the
// VM through istiod, as an operator runs it.
func TestIstiodModeServesIstiodConfiguration(t *testing.T) {
	i := startIstiod(t)
	r := startReplica(t, "replica-a", nil, func(o *Options) { o.Relay = istiodRelay(t, i, nil) })
	ns := env.Namespace(t)
	bookinfo(t, ns)
	w := register(t, ns, "i-1234567890abcdef0", "10.0.9.1")
	_, e := startVM(t, r, i, w, ns)
	e.subscribeAll()
	waitState(t, w.key, connected("replica-a"))

	// The AuthorizationPolicy is enforced on the VM's inbound listener.
	policy := fmt.Sprintf("ns[%s]-policy[ratings-viewer]-rule[0]", ns)
	var inbound bool
	for _, a := range e.latest(resource.ListenerType).GetResources() {
		if bytes.Contains(a.GetValue(), []byte("virtualInbound")) && bytes.Contains(a.GetValue(), []byte("envoy.filters.http.rbac")) && bytes.Contains(a.GetValue(), []byte(policy)) {
			inbound = true
		}
	}
	if !inbound {
		t.Errorf("no inbound listener with the RBAC policy %s", policy)
	}
	// The VirtualService's route is in the VM's RDS.
	rc := &route.RouteConfiguration{}
	if rds := e.latest(resource.RouteType); len(rds.GetResources()) != 1 {
		t.Fatalf("RDS 9080: %d route configurations", len(rds.GetResources()))
	} else if err := rds.GetResources()[0].UnmarshalTo(rc); err != nil {
		t.Fatal(err)
	}
	var timeout *durationpb.Duration
	for _, vh := range rc.GetVirtualHosts() {
		for _, rt := range vh.GetRoutes() {
			if rt.GetName() == "reviews-timeout" {
				timeout = rt.GetRoute().GetTimeout()
			}
		}
	}
	if timeout.AsDuration() != 7*time.Second {
		t.Errorf("route reviews-timeout timeout %v, want the VirtualService's 7s", timeout.AsDuration())
	}
	// The DestinationRule's connection limit is in the VM's CDS.
	reviews := findCluster(t, e.latest(resource.ClusterType), "outbound|9080||reviews."+ns+".svc.cluster.local")
	if got := maxConnections(reviews); got != 7 {
		t.Errorf("reviews cluster max connections %d, want the DestinationRule's 7", got)
	}

	// istioctl proxy-status through istiod lists the VM.
	name := w.key.Name + "." + ns
	plain, perType := waitSynced(t, i, name)
	t.Logf("istioctl proxy-status --xds-address <istiod> --plaintext -r default:\n%s\nwith -v 1:\n%s", plain, perType)
	row, _ := proxyStatus(t, i, name)
	if row["ISTIOD"] != "istiod-local" {
		t.Errorf("ISTIOD column %q, want istiod's pod name istiod-local", row["ISTIOD"])
	}
	// istioctl proxy-config reads the dump istiod keeps of the VM's
	// configuration (there is no Envoy admin port on a VM it can reach).
	// endpoints and secret read Envoy's own admin state (/clusters, the
	// secrets it got from pilot-agent over SDS), which only the VM's Envoy
	// has: see docs/istiod.md; the VM's EDS is checked through pilot-agent
	// (subscribeAll, EDS SYNCED above) and its secrets over pilot-agent's
	// SDS socket (test/istiod).
	dump := fetchConfigDump(t, i, name)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"proxy-config", "listeners", "--file", dump}, "15006"}, // istiod's inbound listener (virtualInbound)
		{[]string{"proxy-config", "routes", "--file", dump}, "reviews." + ns + ".svc.cluster.local"},
		{[]string{"proxy-config", "clusters", "--file", dump}, "reviews." + ns + ".svc.cluster.local"},
		{[]string{"proxy-config", "all", "--file", dump}, "15006"},
	} {
		out, err := istioagent.Istioctl(t.Context(), t, c.args...)
		if err != nil || !strings.Contains(out, c.want) {
			t.Errorf("istioctl %v (%v) lacks %q:\n%s", c.args, err, c.want, out)
		}
	}

	// istiod did not register or health-check the VM itself: the
	// WorkloadEntry is Embark's, without istiod's annotations.
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(t.Context(), w.key, we); err != nil {
		t.Fatal(err)
	}
	for k := range we.GetAnnotations() {
		if strings.HasPrefix(k, "istio.io/") {
			t.Errorf("istiod annotated Embark's WorkloadEntry: %s", k)
		}
	}
}

// fetchConfigDump saves istiod's config dump of a connected proxy to a file.
func fetchConfigDump(t *testing.T, i *testenv.Istiod, proxyID string) string {
	t.Helper()
	resp, err := http.Get("http://" + i.HTTPAddr + "/debug/config_dump?proxyID=" + proxyID)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("config dump of %s: %d %v\n%s", proxyID, resp.StatusCode, err, body)
	}
	path := filepath.Join(t.TempDir(), "config_dump.json")
	if err := os.WriteFile(path, body, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestIstiodModeSurvivesIstiod: istiod stopped for a minute and started
// again closes none of the sidecars' streams (three real pilot-agents) and
// flips no AgentConnected; Embark reconnects and resynchronises every
// stream, which then carries the configuration changed meanwhile. Closing a
// sidecar's stream closes its istiod stream.
func TestIstiodModeSurvivesIstiod(t *testing.T) {
	i := startIstiod(t)
	reg := prometheus.NewRegistry()
	relayMetrics, err := relay.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, "replica-a", nil, func(o *Options) { o.Relay = istiodRelay(t, i, relayMetrics) })
	ns := env.Namespace(t)
	bookinfo(t, ns)
	type vm struct {
		w      *workload
		agent  *istioagent.Agent
		envoy  *envoy
		name   string
		before metav1.Condition
	}
	vms := make([]*vm, 3)
	for n := range vms {
		w := register(t, ns, fmt.Sprintf("i-0badc0ffee000000%d", n+1), fmt.Sprintf("10.0.9.%d", n+2))
		agent, e := startVM(t, r, i, w, ns)
		e.subscribeAll()
		vms[n] = &vm{w: w, agent: agent, envoy: e, name: w.key.Name + "." + ns}
	}
	for _, v := range vms {
		waitState(t, v.w.key, connected("replica-a"))
		waitSynced(t, i, v.name)
		v.before = agentConnected(t, v.w)
	}
	streamsBefore := r.server.relayed.Load()

	i.Stop()
	// While istiod is away the DestinationRule changes.
	dr := &istionetworkingv1.DestinationRule{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "reviews"}, dr); err != nil {
		t.Fatal(err)
	}
	dr.Spec.TrafficPolicy.ConnectionPool.Tcp.MaxConnections = 9
	if err := env.Client.Update(t.Context(), dr); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Minute)
	started := time.Now()
	if err := i.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The same streams get istiod's new configuration.
	for _, v := range vms {
		v.envoy.waitFor(resource.ClusterType, func(cds *discovery.DiscoveryResponse) bool {
			return maxConnections(findCluster(t, cds, "outbound|9080||reviews."+ns+".svc.cluster.local")) == 9
		})
		waitSynced(t, i, v.name)
	}
	t.Logf("%d sidecars resynchronised and SYNCED at istiod %s after it started again", len(vms), time.Since(started).Round(100*time.Millisecond))

	if n := r.server.relayed.Load() - streamsBefore; n != 0 {
		t.Errorf("the sidecars opened %d new streams: a stream was closed", n)
	}
	for _, v := range vms {
		if after := agentConnected(t, v.w); after.Status != metav1.ConditionTrue || !after.LastTransitionTime.Equal(&v.before.LastTransitionTime) {
			t.Errorf("%s: AgentConnected changed while istiod was away: %+v -> %+v", v.name, v.before, after)
		}
	}
	if got := counterValue(t, reg, "embark_xds_relay_upstream_failures_total"); got == 0 {
		t.Error("no upstream failure counted")
	}

	// A sidecar goes: its istiod stream closes, istiod no longer lists it,
	// and still lists the others.
	vms[0].agent.Stop()
	deadline := time.Now().Add(30 * time.Second)
	for {
		row, out := proxyStatus(t, i, vms[0].name)
		if row == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("istiod still lists %s after its sidecar left:\n%s", vms[0].name, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, v := range vms[1:] {
		if row, out := proxyStatus(t, i, v.name); row == nil {
			t.Errorf("istiod no longer lists %s after another sidecar left:\n%s", v.name, out)
		}
	}
}

func agentConnected(t *testing.T, w *workload) metav1.Condition {
	t.Helper()
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), w.key, war); err != nil {
		t.Fatal(err)
	}
	c := meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected)
	if c == nil {
		t.Fatal("no AgentConnected condition")
	}
	return *c
}

// counterValue reads a counter from reg.
func counterValue(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var v float64
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
			return v
		}
	}
	return 0
}

// splitColumns splits a tabwriter row: columns are at least two spaces apart.
var splitColumns = regexp.MustCompile(`\s{2,}`)

// TestIstiodModeNoLeak connects and disconnects a workload's relayed stream
// 1,000 times: every upstream stream closes with its sidecar stream, and the
// process's goroutines and live heap come back to where they were.
func TestIstiodModeNoLeak(t *testing.T) {
	i := startIstiod(t)
	reg := prometheus.NewRegistry()
	relayMetrics, err := relay.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	r := startReplica(t, "replica-a", nil, func(o *Options) {
		o.Relay = istiodRelay(t, i, relayMetrics)
		o.Logger = slog.New(slog.DiscardHandler)
	})
	ns := env.Namespace(t)
	bookinfo(t, ns)
	w := register(t, ns, "i-0badc0ffee0000002", "10.0.9.3")
	conn := dial(t, r.addr)
	node := sidecarNode(w.nodeID)
	node.Metadata.Fields["SERVICE_ACCOUNT"] = structpb.NewStringValue(fixtures.ServiceAccount)
	cycle := func() error {
		s, err := adsclient.OpenSotW(t.Context(), conn, w.token, node)
		if err != nil {
			return err
		}
		defer s.Close()
		if err := s.Request(resource.ClusterType); err != nil {
			return err
		}
		resp, err := s.Recv(0)
		if err != nil {
			return err
		}
		if len(resp.GetResources()) == 0 {
			return errors.New("istiod sent no cluster")
		}
		return nil
	}
	gauge := func(name string) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	settle := func() (int, uint64) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for gauge("embark_xds_relay_streams") != 0 || gauge("embark_xds_relay_upstream_streams") != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("relayed streams still open: %v sidecar, %v upstream", gauge("embark_xds_relay_streams"), gauge("embark_xds_relay_upstream_streams"))
			}
			time.Sleep(20 * time.Millisecond)
		}
		last := -1
		for range 100 {
			runtime.GC()
			n := runtime.NumGoroutine()
			if n == last {
				break
			}
			last = n
			time.Sleep(100 * time.Millisecond)
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return last, ms.HeapAlloc
	}
	for range 100 { // warm up connections, caches and pools
		if err := cycle(); err != nil {
			t.Fatal(err)
		}
	}
	g0, h0 := settle()
	for k := range 1000 {
		if err := cycle(); err != nil {
			t.Fatalf("cycle %d: %v", k, err)
		}
	}
	g1, h1 := settle()
	t.Logf("goroutines %d -> %d, live heap %d -> %d KiB across 1,000 relayed streams", g0, g1, h0>>10, h1>>10)
	if g1 > g0 {
		t.Errorf("goroutines grew from %d to %d across 1,000 relayed streams", g0, g1)
	}
	// A relayed stream holds some KiB while open: 1,000 leaked would add
	// megabytes. 512 KiB of noise (informer caches, connection tracker).
	if h1 > h0+512<<10 {
		t.Errorf("live heap grew by %d KiB across 1,000 relayed streams", (h1-h0)>>10)
	}
	if got := counterValue(t, reg, "embark_xds_relay_upstream_connects_total"); got != 1100 {
		t.Errorf("upstream streams opened: %v, want one per sidecar stream (1,100)", got)
	}
}
