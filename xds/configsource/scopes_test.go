package configsource

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/wrapperspb"
	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/nodeid"
	"github.com/embark-mesh/embark/xds/internal/snapcache"
)

// TestScopesTranslateOncePerGeneration: concurrent proxies of one scope
// share one translation; a change makes the next one translate again; a
// failed translation is not shared; without Run's change events nothing is
// remembered.
func TestScopesTranslateOncePerGeneration(t *testing.T) {
	tests := []struct {
		name     string
		watching bool
		changes  int
		fail     bool
		want     int64
	}{
		{name: "watching, no change", watching: true, want: 1},
		{name: "watching, two changes", watching: true, changes: 2, want: 3},
		{name: "watching, failing", watching: true, fail: true, want: 16},
		{name: "not watching", want: 16},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s scopes
			s.watch(tt.watching)
			var calls atomic.Int64
			translate := func() (*scopeTranslation, error) {
				calls.Add(1)
				if tt.fail {
					return nil, fmt.Errorf("inputs not readable")
				}
				return &scopeTranslation{}, nil
			}
			run := func() {
				var wg sync.WaitGroup
				for range 8 {
					wg.Go(func() {
						_, err := s.get(t.Context(), "ns|", translate)
						if (err != nil) != tt.fail {
							t.Errorf("get: %v", err)
						}
					})
				}
				wg.Wait()
			}
			run()
			for range tt.changes {
				s.changed()
				run()
			}
			if tt.fail || !tt.watching {
				run() // 16 calls in all
			}
			if got := calls.Load(); got != tt.want {
				t.Errorf("%d translations, want %d", got, tt.want)
			}
		})
	}
}

// registerN registers n ratings VMs of one WorkloadGroup in ns (same
// labels: one scope), addresses 10.0.1.1, 10.0.1.2, ...
func registerN(t *testing.T, e *endpoint, ns string, n int) []*workload {
	t.Helper()
	ctx := t.Context()
	wg := &istionetworkingv1.WorkloadGroup{ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: ns}}
	wg.Spec.Template = &istioapi.WorkloadEntry{Labels: map[string]string{"app": "ratings", "class": "vm"}, ServiceAccount: "ratings-vm"}
	if err := env.Client.Create(ctx, wg); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "ratings-vm", Namespace: ns}}); err != nil {
		t.Fatal(err)
	}
	reg, err := registry.NewRegistrar(registry.Options{Client: env.Client, Cache: e.cache, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var out []*workload
	for i := range n {
		ip := fmt.Sprintf("10.0.1.%d", i+1)
		res, err := reg.Write(ctx, registry.Request{
			Group: wg,
			Identity: runtimev1alpha1.WorkloadIdentity{AWS: &runtimev1alpha1.AWSIdentity{
				Partition: "aws", Account: "123456789012", Region: "us-east-2", Zone: "us-east-2b",
				EC2: &runtimev1alpha1.EC2Identity{InstanceID: fmt.Sprintf("i-%017x", i+1)},
			}},
			Registration: runtimev1alpha1.Registration{
				Host:     runtimev1alpha1.HostInfo{Addresses: []runtimev1alpha1.HostAddress{{IP: ip, Type: runtimev1alpha1.AddressTypeVPC}}},
				Settings: runtimev1alpha1.Settings{ConnectedOver: runtimev1alpha1.AddressTypeVPC},
				Sidecar:  runtimev1alpha1.SidecarInfo{Istio: runtimev1alpha1.IstioSidecarInfo{Version: "1.30.0"}},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		key := client.ObjectKeyFromObject(res.Registration)
		out = append(out, &workload{key: key, token: res.SidecarToken.Token,
			nodeID: nodeid.Build(ip, key)})
	}
	return out
}

// TestOneTranslationPerScopeAndChange: N connected workloads with one scope
// (same namespace, Sidecar and labels) cost one translation per change of
// the inputs, and each still gets its own ingress listener on its own
// address next to the shared egress.
func TestOneTranslationPerScopeAndChange(t *testing.T) {
	const n = 6
	ns := env.Namespace(t)
	// Watching this namespace only: other tests' namespaces, deleted
	// seconds after they end, would make pushes of their own meanwhile (a
	// Service deleted anywhere changes every proxy's egress).
	e := startEndpointIn(t, ns, DefaultRootNamespace)
	ctx := t.Context()
	sc := seed004Sidecar(ns)
	svc, es := detailsService(ns)
	for _, o := range []client.Object{sc, svc, es} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	ws := registerN(t, e, ns, n)
	var streams []*stream
	for i, w := range ws {
		s := subscribe(t, e, w)
		s.waitNames(t, "connected", resource.ListenerType, func(l []string) bool {
			return has(fmt.Sprintf("10.0.1.%d_8080", i+1))(l) && has("127.0.0.2_8080")(l)
		})
		streams = append(streams, s)
	}
	changes := []struct {
		name   string
		change func() error
		ok     func([]string) bool
		typ    string
		// reused is how many workloads keep their own resources.
		reused int
	}{
		{"Sidecar egress bind changed", func() error {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc); err != nil {
				return err
			}
			sc.Spec.Egress[0].Bind = "127.0.0.3"
			return env.Client.Update(ctx, sc)
		}, has("127.0.0.3_8080"), resource.ListenerType, n},
		// The inbound cluster of each workload changes: none is kept.
		{"Sidecar ingress defaultEndpoint changed", func() error {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(sc), sc); err != nil {
				return err
			}
			sc.Spec.Ingress[0].DefaultEndpoint = "127.0.0.1:9090"
			return env.Client.Update(ctx, sc)
		}, func([]string) bool { return true }, resource.ClusterType, 0},
		// A ServiceEntry: no controller reacts to it with writes of its
		// own (a Service would get EndpointSlices from the controller
		// manager, a second change).
		{"ServiceEntry created", func() error {
			se := &istionetworkingv1.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: ns}}
			se.Spec.Hosts = []string{"api.example.com"}
			se.Spec.Ports = []*istioapi.ServicePort{{Number: 8080, Protocol: "HTTP", Name: "http"}}
			se.Spec.Resolution = istioapi.ServiceEntry_DNS
			return env.Client.Create(ctx, se)
		}, has("outbound|8080||api.example.com"), resource.ClusterType, n},
	}
	for _, c := range changes {
		// Measure from a quiet state: the controller manager's
		// EndpointSlice of the Service and the connection writes of the
		// registrations may still be arriving on a loaded machine.
		waitQuiet(t, e)
		translations := testutil.ToFloat64(e.metrics.translations)
		configurations := testutil.ToFloat64(e.metrics.configurations)
		reused := testutil.ToFloat64(e.metrics.ownReused)
		if err := c.change(); err != nil {
			t.Fatal(err)
		}
		for i, s := range streams {
			s.waitNames(t, c.name, c.typ, c.ok)
			if c.typ == resource.ListenerType {
				s.waitNames(t, c.name, c.typ, has(fmt.Sprintf("10.0.1.%d_8080", i+1)))
			}
			if c.reused == 0 {
				s.waitInboundPort(t, c.name, 9090)
			}
		}
		if got := testutil.ToFloat64(e.metrics.translations) - translations; got != 1 {
			t.Errorf("%s: %v translations for %d workloads of one scope, want 1", c.name, got, n)
		}
		if got := testutil.ToFloat64(e.metrics.configurations) - configurations; got != n {
			t.Errorf("%s: %v configurations computed, want %d (one per workload)", c.name, got, n)
		}
		if got := testutil.ToFloat64(e.metrics.ownReused) - reused; got != float64(c.reused) {
			t.Errorf("%s: %v workloads kept their own resources, want %d", c.name, got, c.reused)
		}
	}
}

// waitQuiet waits until no configuration has been computed for a second
// (inputs quiet for 50 debounce periods), at most a minute.
func waitQuiet(t *testing.T, e *endpoint) {
	t.Helper()
	last, since := testutil.ToFloat64(e.metrics.configurations), time.Now()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if n := testutil.ToFloat64(e.metrics.configurations); n != last {
			last, since = n, time.Now()
			continue
		}
		if time.Since(since) >= time.Second {
			return
		}
	}
	t.Fatal("configurations still being computed after a minute")
}

// waitInboundPort waits until the stream's inbound|8080|| cluster forwards
// to 127.0.0.1:port.
func (s *stream) waitInboundPort(t *testing.T, what string, port uint32) {
	t.Helper()
	var got uint32
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, a := range s.latest[resource.ClusterType].GetResources() {
			c := &clusterv3.Cluster{}
			if err := a.UnmarshalTo(c); err != nil {
				return false, err
			}
			if c.GetName() == "inbound|8080||" {
				got = c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue()
			}
		}
		return got == port, nil
	})
	if err != nil {
		t.Fatalf("%s: inbound|8080|| forwards to port %d, want %d: %v", what, got, port, err)
	}
}

// TestSnapshotSetsAndVersions: a proxy's snapshot holds its scope's shared
// set of each type and its own; a type's version changes with either; a
// name both shared and the proxy's own is refused.
func TestSnapshotSetsAndVersions(t *testing.T) {
	cluster := func(name string, limit uint32) types.Resource {
		return &clusterv3.Cluster{Name: name, PerConnectionBufferLimitBytes: wrapperspb.UInt32(limit)}
	}
	scope := func(rs ...types.Resource) *scopeTranslation {
		d, err := digest(resource.ClusterType, rs, nil)
		if err != nil {
			t.Fatal(err)
		}
		st := &scopeTranslation{}
		st.types[2] = &sharedType{digest: d, version: hex.EncodeToString(d)[:16], set: snapcache.NewSet(resource.ClusterType, rs)}
		return st
	}
	own := func(rs ...types.Resource) *ownParts {
		d, err := digest(resource.ClusterType, rs, nil)
		if err != nil {
			t.Fatal(err)
		}
		p := &ownParts{}
		p.types[2] = ownType{resources: rs, digest: d, set: snapcache.NewSet(resource.ClusterType, rs)}
		return p
	}
	if servedTypes[2] != resource.ClusterType {
		t.Fatal("servedTypes changed: the test puts clusters at 2")
	}
	version := func(sc *scopeTranslation, o *ownParts) string {
		t.Helper()
		snap, err := sc.snapshot(o)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(snap.GetResources(resource.ClusterType)); got != len(sc.types[2].set.Names())+len(o.types[2].resources) {
			t.Fatalf("%d clusters, want the shared and own ones", got)
		}
		return snap.GetVersion(resource.ClusterType)
	}
	base := version(scope(cluster("out", 1)), own())
	if base != scope(cluster("out", 1)).types[2].version {
		t.Error("without own clusters the version is not the shared one's")
	}
	withOwn := version(scope(cluster("out", 1)), own(cluster("in", 1)))
	ownChanged := version(scope(cluster("out", 1)), own(cluster("in", 2)))
	sharedChanged := version(scope(cluster("out", 2)), own(cluster("in", 1)))
	if len(map[string]bool{base: true, withOwn: true, ownChanged: true, sharedChanged: true}) != 4 {
		t.Errorf("versions %s %s %s %s: want four different", base, withOwn, ownChanged, sharedChanged)
	}
	if _, err := scope(cluster("dup", 1)).snapshot(own(cluster("dup", 2))); err == nil {
		t.Error("a cluster both shared and the proxy's own was served")
	}
}
