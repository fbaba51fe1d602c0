// Package push measures how long one Sidecar change takes to reach every
// connected workload: the change is written to a real kube-apiserver, the
// endpoint's informers see it, configsource debounces, translates and
// validates each affected workload's configuration and the xDS server pushes
// it to 1,000 in-process ADS clients over loopback gRPC. Next to it, in the
// same run, go-control-plane's raw fan-out: SetSnapshot of the same
// listeners for 1,000 nodes on a bare SnapshotCache with 1,000 streams.
//
//	go test -run='^$' -bench=. -benchtime=10x ./benchmarks/push/ [-args -workloads=1000,5000 -debounce=100ms]
//
// Each benchmark runs once per workload count (SidecarChange/workloads=N,
// RawSnapshotFanOut/workloads=N) and reports ms/push (time until the last
// client received the change); the embark one measures it from the Sidecar
// update's write and reports, as seen-ms/push, from its informer seeing the
// change (the endpoint's part, comparable with the raw fan-out), the
// configured debounce and the scope translations per push (one: every
// workload has the same scope). The workloads of the largest count are registered once, up
// front, 32 at a time; the streams of each count stay open for the next.
// The raw fan-out runs first, so that both figures of a count are taken with
// as many streams held (see BenchmarkRawSnapshotFanOut).
//
//embark:bench -test.benchtime=10x -workloads=1000,5000
package push

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/benchmarks/internal/benchkit"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/presence"
	"github.com/embark-mesh/embark/test/testenv"
	"github.com/embark-mesh/embark/translate"
	"github.com/embark-mesh/embark/xds"
	"github.com/embark-mesh/embark/xds/configsource"
)

var (
	workloads = flag.String("workloads", "1000", "comma-separated numbers of connected workloads, ascending")
	debounce  = flag.Duration("debounce", configsource.DefaultDebounce, "configsource debounce")
	verbose   = flag.Bool("verbose", false, "log the endpoint's debug logs to stderr")
	profile   = flag.String("push-cpuprofile", "", "write the process's CPU profile (pprof) of the timed pushes only (endpoint, server and clients) to this file and the raw fan-out's to file.raw, suffixed with the workload count")
	memProf   = flag.String("push-memprofile", "", "write the process's heap profiles (pprof) before and after the timed pushes to this file suffixed .before and .after (and .raw, and the workload count): go tool pprof -sample_index=alloc_space -base F.before F.after shows what the pushes allocated")
	env       *testenv.Env
)

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}, &env) }

const ns = "bookinfo"

// fleet is n ADS clients waiting for a listener name.
type fleet struct {
	n      atomic.Int64
	target atomic.Pointer[string]
	gen    atomic.Int64
	done   atomic.Int64
	all    chan struct{}
	// reopened counts the streams that ended and were opened again;
	// lastErr is the last one's error.
	reopened atomic.Int64
	lastErr  atomic.Value
}

func newFleet(n int) *fleet {
	f := &fleet{all: make(chan struct{}, 1)}
	f.n.Store(int64(n))
	return f
}

// expect starts waiting for name; wait returns when every client saw it.
func (f *fleet) expect(name string) {
	f.done.Store(0)
	f.target.Store(&name)
	f.gen.Add(1)
}

func (f *fleet) wait(b *testing.B) {
	select {
	case <-f.all:
	case <-time.After(10 * time.Minute):
		b.Fatalf("only %d of %d clients got the change", f.done.Load(), f.n.Load())
	}
}

// client runs one ADS stream subscribed to listeners, ACKing everything.
// When its stream ends (the endpoint refused it, e.g. while 4,000 streams'
// token reviews arrive at once, or closed it) it opens another, as a
// sidecar does, after a short back-off: at most 30 times in a row.
func (f *fleet) client(ctx context.Context, conn *grpc.ClientConn, node *core.Node, ready *sync.WaitGroup) error {
	open := func() (discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient, error) {
		s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		if err != nil {
			return nil, err
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ListenerType}); err != nil {
			return nil, err
		}
		return s, nil
	}
	s, err := open()
	if err != nil {
		return err
	}
	go func() {
		var seen int64
		first := true
		failures := 0
		for {
			resp, err := s.Recv()
			for err != nil {
				if ctx.Err() != nil || failures == 30 {
					return
				}
				failures++
				f.reopened.Add(1)
				f.lastErr.Store(err.Error())
				time.Sleep(min(time.Duration(failures)*100*time.Millisecond, 2*time.Second))
				if s, err = open(); err == nil {
					resp, err = s.Recv()
				}
			}
			failures = 0
			_ = s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ListenerType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
			if first {
				first = false
				ready.Done()
			}
			g := f.gen.Load()
			target := f.target.Load()
			if g <= seen || target == nil {
				continue
			}
			for _, a := range resp.GetResources() {
				l := &listenerv3.Listener{}
				if a.UnmarshalTo(l) == nil && l.GetName() == *target {
					seen = g
					if f.done.Add(1) == f.n.Load() {
						f.all <- struct{}{}
					}
					break
				}
			}
		}
	}()
	return nil
}

// reopenedReport says how many streams ended and were opened again since
// the last report, and the last error.
func (f *fleet) reopenedReport() string {
	n := f.reopened.Swap(0)
	if n == 0 {
		return "no stream ended"
	}
	last, _ := f.lastErr.Load().(string)
	return fmt.Sprintf("%d streams ended and were opened again (last: %s)", n, last)
}

func sidecar(bind string) *istionetworkingv1.Sidecar {
	sc := &istionetworkingv1.Sidecar{ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: ns}}
	sc.Spec.WorkloadSelector = &istioapi.WorkloadSelector{Labels: map[string]string{"app": "ratings"}}
	sc.Spec.Ingress = []*istioapi.IstioIngressListener{{DefaultEndpoint: "127.0.0.1:8080", Port: &istioapi.SidecarPort{Name: "http", Number: 8080, Protocol: "HTTP"}}}
	sc.Spec.Egress = []*istioapi.IstioEgressListener{{Bind: bind, Port: &istioapi.SidecarPort{Name: "http", Number: 8080, Protocol: "HTTP"}, Hosts: []string{"./*"}}}
	return sc
}

// setup is shared by both benchmarks: the connected embark fleet, and one
// workload's translated listeners for the raw baseline.
type setup struct {
	fleet     *fleet
	source    *configsource.Source
	registry  *prometheus.Registry
	server    *xds.Server
	listeners map[string][]types.Resource // by egress bind
	pushes    int                         // Sidecar updates so far
	err       error

	// seen is when the endpoint's informer last saw a Sidecar update
	// (Unix ns): where the endpoint's part of a push begins.
	seen atomic.Int64

	regs    []*benchkit.Workload // of the largest count
	addr    string
	conns   []*grpc.ClientConn
	streams int // connected so far
}

// counts are the -workloads counts.
func counts(b *testing.B) []int {
	out, err := benchkit.Counts("workloads", *workloads)
	if err != nil || !slices.IsSorted(out) {
		b.Fatalf("-workloads %q: want ascending positive counts", *workloads)
	}
	return out
}

var (
	once   sync.Once
	shared setup
)

// start registers the workloads of the largest count (once) and connects n
// of them.
func start(b *testing.B, n int) *setup {
	all := counts(b)
	once.Do(func() { shared.err = shared.start(all[len(all)-1]) })
	if shared.err != nil {
		b.Fatal(shared.err)
	}
	if err := shared.connect(n); err != nil {
		b.Fatal(err)
	}
	return &shared
}

func (s *setup) start(total int) error {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	if *verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return err
	}
	c, err := env.StartCache(ctx, func(c crcache.Cache) error { return registry.SetupIndexes(ctx, c) }, append(configsource.Watched(), &corev1.SecretList{})...)
	if err != nil {
		return err
	}
	sidecars, err := c.GetInformer(ctx, &istionetworkingv1.Sidecar{})
	if err != nil {
		return err
	}
	if _, err := sidecars.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(any, any) { s.seen.Store(time.Now().UnixNano()) },
	}); err != nil {
		return err
	}
	// A bookinfo-like namespace: four Services the Sidecar's ./* selects.
	for _, name := range []string{"productpage", "details", "reviews", "ratings"} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
		svc.Spec.Selector = map[string]string{"app": name}
		svc.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 8080}}
		if err := env.Client.Create(ctx, svc); err != nil {
			return err
		}
	}
	if err := env.Client.Create(ctx, sidecar("127.0.0.2")); err != nil {
		return err
	}
	wg, err := benchkit.RatingsGroup(ctx, env.Client, ns)
	if err != nil {
		return err
	}
	reg, err := registry.NewRegistrar(registry.Options{Client: env.Client, Cache: c, Logger: log})
	if err != nil {
		return err
	}
	registering := time.Now()
	// 32 at a time: each registration waits on four API calls in turn, so
	// the API server (not the client) is the limit.
	regs, err := benchkit.Register(ctx, benchkit.Registration{Registrar: reg, Group: wg, N: total, Workers: 32,
		IP: func(i int) string { return fmt.Sprintf("10.1.%d.%d", i/250, i%250+1) }})
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	fmt.Fprintf(os.Stderr, "push: registered %d workloads in %s\n", total, time.Since(registering).Round(time.Millisecond))
	s.regs = regs

	conns, err := presence.NewConnections(ctx, presence.ConnectionOptions{Client: env.Client, Replica: "bench", Logger: log})
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		return err
	}
	s.registry = prometheus.NewRegistry()
	metrics, err := configsource.NewMetrics(s.registry)
	if err != nil {
		return err
	}
	if s.source, err = configsource.New(configsource.Options{Cache: c, Debounce: *debounce, Logger: log, Metrics: metrics}); err != nil {
		return err
	}
	if s.server, err = xds.NewServer(ctx, xds.Options{
		Connections: conns, TokenReviews: cs.AuthenticationV1().TokenReviews(),
		Reader: c, APIReader: env.Client, Informers: c, Config: s.source, Logger: log,
	}); err != nil {
		return err
	}
	g := grpc.NewServer()
	s.server.Register(g)
	addr, err := serve(g)
	if err != nil {
		return err
	}
	go func() { _ = s.server.Run(ctx) }()
	go func() { _ = s.source.Run(ctx, s.server) }()

	s.addr = addr
	s.fleet = newFleet(0)
	if s.conns, err = dialN(addr, 10); err != nil {
		return err
	}
	if err := s.connect(1); err != nil {
		return err
	}

	// The baseline serves the listeners translation gives one workload.
	s.listeners = map[string][]types.Resource{}
	p := s.server.Proxies()[0]
	for _, bind := range []string{"127.0.0.2", "127.0.0.3"} {
		in, err := s.source.Inputs(ctx, p)
		if err != nil {
			return err
		}
		for i, sc := range in.Sidecars { // the cache's objects: copy before changing
			in.Sidecars[i] = sc.DeepCopy()
			in.Sidecars[i].Spec.Egress[0].Bind = bind
		}
		res, err := translate.Translate(in)
		if err != nil {
			return err
		}
		s.listeners[bind] = res.Listeners
	}
	return nil
}

// pushSeconds is embark_xds_config_push_seconds' sum and count.
func (s *setup) pushSeconds(b *testing.B) (sum float64, count uint64) {
	families, err := s.registry.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "embark_xds_config_push_seconds" {
			h := f.GetMetric()[0].GetHistogram()
			return h.GetSampleSum(), h.GetSampleCount()
		}
	}
	b.Fatal("no embark_xds_config_push_seconds")
	return 0, 0
}

// translations is embark_xds_config_translations_total.
func (s *setup) translations(b *testing.B) float64 {
	families, err := s.registry.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "embark_xds_config_translations_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	b.Fatal("no embark_xds_config_translations_total")
	return 0
}

// connect opens streams until n are open, and waits until each has its
// first configuration.
func (s *setup) connect(n int) error {
	if n <= s.streams {
		return nil
	}
	ctx := context.Background()
	var ready sync.WaitGroup
	ready.Add(n - s.streams)
	connecting := time.Now()
	for i := s.streams; i < n; i++ {
		r := s.regs[i]
		sctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+r.Token)
		node := &core.Node{Id: r.NodeID, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"PROXY_CONFIG": structpb.NewStructValue(&structpb.Struct{})}}}
		if err := s.fleet.client(sctx, s.conns[i%len(s.conns)], node, &ready); err != nil {
			return err
		}
	}
	ready.Wait()
	fmt.Fprintf(os.Stderr, "push: %d streams open (%d new in %s); %s\n", n, n-s.streams, time.Since(connecting).Round(time.Millisecond), s.fleet.reopenedReport())
	// Measure from a quiet state: the connections' writes (registration
	// status and WorkloadEntry annotations, 2 per workload at the replica's
	// write budget) would otherwise compete with the push for the 2 cores.
	if err := waitConnectionsStored(ctx, n); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "push: %d connections stored %s after the streams opened\n", n, time.Since(connecting).Round(time.Millisecond))
	s.streams = n
	s.fleet.n.Store(int64(n))
	return nil
}

// waitConnectionsStored waits until n registrations store AgentConnected=True
// and n WorkloadEntries show their connection.
func waitConnectionsStored(ctx context.Context, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for {
		wars := &runtimev1alpha1.WorkloadAutoRegistrationList{}
		entries := &istionetworkingv1.WorkloadEntryList{}
		if err := env.Client.List(ctx, wars, client.InNamespace(ns)); err != nil {
			return err
		}
		if err := env.Client.List(ctx, entries, client.InNamespace(ns)); err != nil {
			return err
		}
		connected, shown := 0, 0
		for i := range wars.Items {
			if meta.IsStatusConditionTrue(wars.Items[i].Status.Conditions, runtimev1alpha1.ConditionAgentConnected) {
				connected++
			}
		}
		for _, we := range entries.Items {
			if we.Annotations[registry.AnnotationConnectedAt] != "" {
				shown++
			}
		}
		if connected >= n && shown >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d connections stored (%d entries): %w", connected, n, shown, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func serve(g *grpc.Server) (string, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() { _ = g.Serve(lis) }()
	return lis.Addr().String(), nil
}

func dialN(addr string, n int) ([]*grpc.ClientConn, error) {
	var out []*grpc.ClientConn
	for range n {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// BenchmarkRawSnapshotFanOut is the baseline: a bare go-control-plane
// SnapshotCache and server with the same number of streams; one push is a
// SetSnapshot per node of the same listeners, until every client has them.
// It is declared (so run) before BenchmarkSidecarChange: each count's two
// figures are then taken with the same objects and as many streams held in
// the process (the registrations of the largest count, and N streams, the
// raw ones or the endpoint's). Run after it, the raw fan-out had the
// endpoint's streams of the largest count as well, a larger heap that the
// garbage collector scans less often (raw 1,000: 24 ms in a run with 5,000
// endpoint streams held, 38 ms in runs of 1,000 alone).
func BenchmarkRawSnapshotFanOut(b *testing.B) {
	for _, n := range counts(b) {
		b.Run(fmt.Sprintf("workloads=%d", n), func(b *testing.B) { rawFanOut(b, n) })
	}
}

func rawFanOut(b *testing.B, n int) {
	s := start(b, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	snapshots := cache.NewSnapshotCache(false, cache.IDHash{}, nil)
	g := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(ctx, snapshots, nil))
	defer g.Stop()
	addr, err := serve(g)
	if err != nil {
		b.Fatal(err)
	}
	f := newFleet(n)
	nodes := make([]string, n)
	first, err := cache.NewSnapshot("0", map[resource.Type][]types.Resource{resource.ListenerType: s.listeners["127.0.0.2"]})
	if err != nil {
		b.Fatal(err)
	}
	conns, err := dialN(addr, 10)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	var ready sync.WaitGroup
	ready.Add(n)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("node-%d", i)
		if err := snapshots.SetSnapshot(ctx, nodes[i], first); err != nil {
			b.Fatal(err)
		}
		if err := f.client(ctx, conns[i%len(conns)], &core.Node{Id: nodes[i]}, &ready); err != nil {
			b.Fatal(err)
		}
	}
	ready.Wait()
	binds := []string{"127.0.0.3", "127.0.0.2"}
	var total time.Duration
	stopProfile := startProfile(b, ".raw", n)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		bind := binds[i%2]
		snap, err := cache.NewSnapshot(fmt.Sprint(i+1), map[resource.Type][]types.Resource{resource.ListenerType: s.listeners[bind]})
		if err != nil {
			b.Fatal(err)
		}
		f.expect(bind + "_8080")
		start := time.Now()
		for _, n := range nodes {
			if err := snapshots.SetSnapshot(ctx, n, snap); err != nil {
				b.Fatal(err)
			}
		}
		f.wait(b)
		total += time.Since(start)
	}
	b.StopTimer()
	stopProfile()
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/push")
	b.ReportMetric(float64(n), "workloads")
}

// BenchmarkSidecarChange: one Sidecar update (its egress bind toggles)
// until every connected workload has the new listeners.
func BenchmarkSidecarChange(b *testing.B) {
	for _, n := range counts(b) {
		b.Run(fmt.Sprintf("workloads=%d", n), func(b *testing.B) { sidecarChange(b, n) })
	}
}

func sidecarChange(b *testing.B, n int) {
	s := start(b, n)
	ctx := context.Background()
	var total, fromSeen time.Duration
	translations := s.translations(b)
	pushSum, pushCount := s.pushSeconds(b)
	stopProfile := startProfile(b, "", n)
	b.ResetTimer()
	for range b.N {
		// Toggle from what the Sidecar has (the benchmark runs more than once).
		s.pushes++
		bind := []string{"127.0.0.2", "127.0.0.3"}[s.pushes%2]
		sc := &istionetworkingv1.Sidecar{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "ratings"}, sc); err != nil {
			b.Fatal(err)
		}
		sc.Spec.Egress[0].Bind = bind
		s.fleet.expect(bind + "_8080")
		s.seen.Store(0)
		start := time.Now()
		if err := env.Client.Update(ctx, sc); err != nil {
			b.Fatal(err)
		}
		s.fleet.wait(b)
		end := time.Now()
		total += end.Sub(start)
		seen := s.seen.Load()
		if seen == 0 {
			b.Fatal("the informer did not see the Sidecar update")
		}
		fromSeen += end.Sub(time.Unix(0, seen))
	}
	b.StopTimer()
	stopProfile()
	fmt.Fprintf(os.Stderr, "push: during the pushes to %d: %s\n", n, s.fleet.reopenedReport())
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/push")
	// The endpoint's part: from its informer seeing the change (the API
	// server's write and watch done) until every client has it, as the
	// raw fan-out is from its first SetSnapshot.
	b.ReportMetric(float64(fromSeen.Microseconds())/1000/float64(b.N), "seen-ms/push")
	b.ReportMetric(float64(debounce.Milliseconds()), "debounce-ms")
	b.ReportMetric(float64(n), "workloads")
	b.ReportMetric((s.translations(b)-translations)/float64(b.N), "translations/push")
	// Where the time goes: from the first change the informer saw until
	// every proxy's snapshot is set (the debounce included); the rest of
	// ms/push is the API server's write and watch before, and the delivery
	// to the sidecars after.
	if sum, count := s.pushSeconds(b); count > pushCount {
		b.ReportMetric((sum-pushSum)*1000/float64(count-pushCount), "set-ms/push")
	}
}

// startProfile starts the CPU profile of -push-cpuprofile (if set) for n
// workloads, its file name suffixed with suffix and n; the returned func
// stops it. It replaces go test's -cpuprofile,
// which would mostly profile the registrations and connections.
func startProfile(b *testing.B, suffix string, n int) (stop func()) {
	heap := func(when string) {
		if *memProf == "" {
			return
		}
		f, err := os.Create(fmt.Sprintf("%s%s.%d.%s", *memProf, suffix, n, when))
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			b.Fatal(err)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
	heap("before")
	if *profile == "" {
		return func() { heap("after") }
	}
	f, err := os.Create(fmt.Sprintf("%s%s.%d", *profile, suffix, n))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatalf("-push-cpuprofile (not with go test's -cpuprofile): %v", err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Error(err)
		}
		heap("after")
	}
}
