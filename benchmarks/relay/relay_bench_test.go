// Package relay benchmarks istiod mode: what relaying a sidecar's ADS stream
// through Embark to a real istiod (pilot-discovery) costs, next to the same
// clients connected straight to istiod's secure port in the same run:
//
//	go test -run='^$' -bench=. -benchtime=1x ./benchmarks/relay/ -args -streams=1000,10000 -json=relay.json
//
// (-json writes the figures in the benchjson format of `make bench`;
// -heapprofile=file writes this process's in-use heap profile while the
// relayed streams are held (with -test.memprofilerate=4096 for a fine
// sampling): `go tool pprof -sample_index=inuse_space file`
// shows where Embark's per-stream heap goes.)
//
// The clients run in a process of their own (this test binary started
// again, clients_test.go): with both ends of 10,000 connections in one
// process it would need more file descriptors than a usual hard limit.
//
// For each stream count, both ways in turn (direct first, then relayed):
// every workload's stream subscribes to CDS and LDS and ACKs them (istiod
// generates the configuration of four Services) and, as a sidecar, reads and
// ACKs whatever is pushed afterwards; then the heap and goroutines per held
// stream (on the relayed side once Embark stored the connection states:
// 1,000 connects at once queue two rate-limited writes per workload, and the
// heap right after connecting is reported too); then the latency of a
// relayed response: each stream subscribes to RDS 9080, 16 at a time, and
// the time to istiod's answer is taken (p50 and p99 both ways, and the
// difference: what the relay adds); then a large push (-push-hosts, default
// 1,000; 0 for none): ServiceEntries of that many hosts are written and
// the time until the last stream ACKed the CDS response carrying them
// (about 0.9 MB each) is taken, both ways (LargePushRelayed,
// LargePushDirect). Each side's istiod baseline is taken once istiod's heap
// is steady (what the side before and its push left is released).
//
// Both client-facing sides serve TLS: istiod's secure port with its own
// certificate, Embark's listener with a key of the same kind and size and a
// chain of the same length, and the same clients verify both. Each stream
// dials its own connection by default (-streams-per-conn=1), as each VM's
// sidecar does; Embark's relayed streams share one connection to istiod.
// Heap counted: istiod's from its pprof endpoint after a forced GC
// (/debug/pprof/heap?gc=1); the client process's and this process's
// together (the clients' on both sides, Embark's on the relayed side), so
// that Embark's is the relayed figure minus the direct one. The heap ratio
// is (Embark + istiod relayed) / istiod direct, the clients in neither; the
// ratio with the clients on both sides is reported too. Targets
// (benchmarks/report/targets.go, at 10,000 streams): relayed heap at most
// 1.0 x direct, under 5 ms added at p99, the large push at most 1.25 x
// direct. benchmarks/README.md says what each figure counts.
package relay

//embark:bench -test.benchtime=1x -streams=1000,10000

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/embark-mesh/embark/benchmarks/benchjson"
	"github.com/embark-mesh/embark/benchmarks/internal/benchkit"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/limits"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/presence"
	"github.com/embark-mesh/embark/test/testenv"
	"github.com/embark-mesh/embark/xds"
	"github.com/embark-mesh/embark/xds/relay"
	"github.com/embark-mesh/embark/xds/upstream"
)

var (
	flags       = benchkit.StreamFlags("write this process's in-use heap profile (pprof) while the relayed streams are held, after a forced GC")
	pushHosts   = flag.Int("push-hosts", defaultPushHosts, "hosts of the ServiceEntry written once the streams are held, pushed to every stream as that many clusters (0: no large push)")
	perConnFlag = flag.Int("streams-per-conn", 1, "streams per client connection: 1 is production's shape (each sidecar dials its own connection); 100 multiplexes them and leaves only per-stream costs")

	cluster benchkit.Cluster
)

// TestMain runs the benchmarks, or in the client process (clientsEnv set)
// the benchmark's ADS clients.
func TestMain(m *testing.M) {
	if spec := os.Getenv(clientsEnv); spec != "" {
		os.Exit(runClients(spec))
	}
	benchkit.Main(m, &cluster)
}

// registerAll registers n ratings VMs in a new namespace with four Services
// istiod configures them with, and returns the namespace and the VMs.
func registerAll(b *testing.B, n int) (string, []*benchkit.Workload) {
	b.Helper()
	ctx := b.Context()
	ns := cluster.Env.Namespace(b)
	for _, name := range []string{"ratings", "reviews", "details", "productpage"} {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": name},
				Ports: []corev1.ServicePort{{Name: "http", Port: 9080, TargetPort: intstr.FromInt32(9080)}}},
		}
		if err := cluster.Env.Client.Create(ctx, svc); err != nil {
			b.Fatal(err)
		}
	}
	wg, err := benchkit.RatingsGroup(ctx, cluster.Env.Client, ns)
	if err != nil {
		b.Fatal(err)
	}
	reg, err := registry.NewRegistrar(registry.Options{Client: cluster.Env.Client, Cache: cluster.Informers, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	ws, err := benchkit.Register(ctx, benchkit.Registration{Registrar: reg, Group: wg, N: n, Workers: 8})
	if err != nil {
		b.Fatal(err)
	}
	return ns, ws
}

// startEmbark starts Embark's xDS server in istiod mode, serving TLS with
// serving, and returns its address and a function that waits until its
// connection tracker has stored every connection state.
func startEmbark(b *testing.B, i *testenv.Istiod, serving *tls.Config) (string, func()) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	roots := filepath.Join(b.TempDir(), "root-cert.pem")
	if err := os.WriteFile(roots, i.RootCert, 0o600); err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	conn, err := upstream.Dial(ctx, upstream.Options{Address: i.SecureGRPCAddr, ServerName: testenv.IstiodServerName, RootCertFile: roots, Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	rl, err := relay.New(relay.Options{Conn: conn, Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	conns, err := presence.NewConnections(ctx, presence.ConnectionOptions{Client: cluster.Env.Client, Replica: "replica-a", Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := xds.NewServer(ctx, xds.Options{
		Connections: conns, TokenReviews: cluster.Clientset.AuthenticationV1().TokenReviews(),
		Reader: cluster.Informers, APIReader: cluster.Env.Client, Informers: cluster.Informers, Logger: log, Relay: rl,
	})
	if err != nil {
		b.Fatal(err)
	}
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = srv.Run(ctx) }()
	// The endpoint's per-source limits are left out (every client here is
	// 127.0.0.1); its TLS is the endpoint's own (limits.TLSServerOptions).
	opts := limits.TLSServerOptions(serving)
	g := grpc.NewServer(append(opts, grpc.MaxConcurrentStreams(1<<20))...)
	srv.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	b.Cleanup(func() {
		g.Stop()
		<-done
		_ = conn.Close()
		cancel()
		<-runDone
		conns.Wait()
	})
	settle := func() {
		ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
		defer cancel()
		if err := conns.Flush(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return lis.Addr().String(), settle
}

func quantile(d []time.Duration, q float64) time.Duration {
	return d[min(len(d)-1, int(q*float64(len(d))))]
}

// istiodMemory is istiod's live heap after a forced GC and its goroutine
// stacks, from the runtime statistics at the end of its pprof heap profile.
func istiodMemory(b *testing.B, i *testenv.Istiod) (heap, stack uint64) {
	b.Helper()
	resp, err := http.Get("http://" + i.HTTPAddr + "/debug/pprof/heap?debug=1&gc=1")
	if err != nil {
		b.Fatalf("istiod heap profile: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("istiod heap profile: HTTP %d, %v", resp.StatusCode, err)
	}
	var haveHeap, haveStack bool
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "# HeapAlloc = "); ok {
			heap, haveHeap = parseStat(b, line, v), true
		}
		if v, ok := strings.CutPrefix(line, "# Stack = "); ok { // "inuse / sys"
			v, _, _ = strings.Cut(v, " /")
			stack, haveStack = parseStat(b, line, v), true
		}
	}
	if !haveHeap || !haveStack {
		b.Fatalf("istiod heap profile has no HeapAlloc or Stack line (%d bytes)", len(body))
	}
	return heap, stack
}

// steadyIstiod waits (at most 60 s) until istiod's heap after a GC changes
// by less than 1% in 2 s, and returns its heap and stacks: what the side
// before left (the large push, its streams) is released before a side's
// baseline is taken.
func steadyIstiod(b *testing.B, i *testenv.Istiod) (heap, stack uint64) {
	b.Helper()
	heap, stack = istiodMemory(b, i)
	for range 30 {
		time.Sleep(2 * time.Second)
		h2, s2 := istiodMemory(b, i)
		if diff := float64(h2) - float64(heap); diff < 0.01*float64(heap) && -diff < 0.01*float64(heap) {
			return h2, s2
		}
		heap, stack = h2, s2
	}
	return heap, stack
}

func parseStat(b *testing.B, line, v string) uint64 {
	b.Helper()
	n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
	if err != nil {
		b.Fatalf("istiod heap profile: %q: %v", line, err)
	}
	return n
}

// steadyHeap waits (at most 30 s) until the heap after a GC changes by less
// than 1% in 2 s: the pushes istiod makes for the WorkloadEntries Embark
// just wrote are through.
func steadyHeap() memory {
	m := heap()
	for range 15 {
		time.Sleep(2 * time.Second)
		m2 := heap()
		if diff := float64(m2.Heap) - float64(m.Heap); diff < 0.01*float64(m.Heap) && -diff < 0.01*float64(m.Heap) {
			return m2
		}
		m = m2
	}
	return m
}

// memory is a process's live heap, goroutine stacks and goroutines.
type memory struct {
	Heap       uint64 `json:"heap"`
	Stack      uint64 `json:"stack"`
	Goroutines int    `json:"goroutines"`
}

func heap() memory {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memory{Heap: ms.HeapAlloc, Stack: ms.StackInuse, Goroutines: runtime.NumGoroutine()}
}

// writeHeapProfile writes the in-use heap profile as of the last GC (heap
// just ran two): what the held streams keep, by allocating stack.
func writeHeapProfile(b *testing.B, file string) {
	b.Helper()
	f, err := os.Create(file)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
}

// side is one way's figures.
type side struct {
	// ProcessHeapBytesPerStream is this process's heap per held stream:
	// the clients', and on the relayed side Embark's too (once Embark
	// stored the connections).
	ProcessHeapBytesPerStream float64 `json:"processHeapBytesPerStream"`
	// ProcessHeapBytesPerStreamUnsettled is the same right after the
	// streams opened, while Embark's rate-limited connection writes (two
	// per workload, 50 a second by default) are still queued.
	ProcessHeapBytesPerStreamUnsettled float64 `json:"processHeapBytesPerStreamUnsettled"`
	// IstiodHeapBytesPerStream is istiod's heap per held stream.
	IstiodHeapBytesPerStream float64 `json:"istiodHeapBytesPerStream"`
	// ProcessStackBytesPerStream and IstiodStackBytesPerStream are the
	// goroutine stacks per held stream (not heap), this process's and
	// istiod's.
	ProcessStackBytesPerStream float64 `json:"processStackBytesPerStream"`
	IstiodStackBytesPerStream  float64 `json:"istiodStackBytesPerStream"`
	GoroutinesPerStream        float64 `json:"goroutinesPerStream"`
	P50Millis                  float64 `json:"p50Millis"`
	P99Millis                  float64 `json:"p99Millis"`
	// LargePushMillis is the time from writing the large configuration
	// (-push-hosts) until the last stream ACKed it; LargePushBytes the
	// size of the CDS response that carried it.
	LargePushMillis float64 `json:"largePushMillis"`
	LargePushBytes  int     `json:"largePushBytes"`
}

// result is one stream count's figures.
type result struct {
	Streams        int  `json:"streams"`
	StreamsPerConn int  `json:"streamsPerConn"`
	Relayed        side `json:"relayed"`
	Direct         side `json:"direct"`
	// ClientHeapBytesPerStream is the clients' heap per stream (this
	// process's direct figure): the same clients, the same TLS, on both
	// sides.
	ClientHeapBytesPerStream float64 `json:"clientHeapBytesPerStream"`
	// EmbarkHeapBytesPerStream is what Embark holds per relayed stream
	// (this process's heap relayed minus direct: its connection from the
	// sidecar, the relayed stream, its share of the connection to istiod,
	// its admission and liveness state).
	EmbarkHeapBytesPerStream float64 `json:"embarkHeapBytesPerStream"`
	// EmbarkHeapBytesPerStreamUnsettled is the same right after the
	// streams opened (Embark's connection writes still queued).
	EmbarkHeapBytesPerStreamUnsettled float64 `json:"embarkHeapBytesPerStreamUnsettled"`
	// HeapRatio is the servers' heap per stream, relayed over direct:
	// (Embark + istiod relayed) / istiod direct. The clients' own heap is
	// left out of both (target <= 1.3).
	HeapRatio float64 `json:"heapRatio"`
	// HeapRatioWithClients counts the clients on both sides too:
	// (clients + Embark + istiod) / (clients + istiod).
	HeapRatioWithClients float64 `json:"heapRatioWithClients"`
	// EmbarkStackBytesPerStream is Embark's goroutine stacks per relayed
	// stream (relayed minus direct, as its heap).
	EmbarkStackBytesPerStream float64 `json:"embarkStackBytesPerStream"`
	// MemoryRatio is HeapRatio with the servers' goroutine stacks added
	// on both sides: (Embark + istiod relayed, heap + stacks) / istiod
	// direct (heap + stacks).
	MemoryRatio float64 `json:"memoryRatio"`
	// AddedP50Millis and AddedP99Millis are what the relay adds to a
	// response (target < 5 ms at p99).
	AddedP50Millis float64 `json:"addedP50Millis"`
	AddedP99Millis float64 `json:"addedP99Millis"`
}

// measureSide holds a stream per workload of spec (in the client process)
// and measures; settle (nil: nothing to wait for) waits until the server's
// own writes for the new connections are done, so that the heap is what
// held streams keep. The process figures are the client process's and this
// process's together: the clients' on both sides, and on the relayed side
// Embark's too.
func measureSide(b *testing.B, i *testenv.Istiod, ns string, spec clientSpec, settle func(), profile string) side {
	b.Helper()
	m0 := heap()
	ih0, is0 := steadyIstiod(b, i)
	p, cr, err := startClients(spec)
	if err != nil {
		b.Fatal(err)
	}
	defer p.close()
	mc := heap()
	if settle != nil {
		settle()
	}
	m1 := steadyHeap()
	ih1, is1 := istiodMemory(b, i)
	if profile != "" {
		writeHeapProfile(b, profile)
	}
	lr, err := p.do(clientCommand{Op: "latencies"})
	if err != nil {
		b.Fatal(err)
	}
	lat := lr.Latencies
	n := float64(len(spec.Streams))
	clients := func(f func(memory) float64) float64 { return f(*cr.Held) - f(*cr.Base) }
	heapOf := func(m memory) float64 { return float64(m.Heap) }
	stackOf := func(m memory) float64 { return float64(m.Stack) }
	s := side{
		ProcessHeapBytesPerStream:          (heapOf(m1) - heapOf(m0) + clients(heapOf)) / n,
		ProcessHeapBytesPerStreamUnsettled: (heapOf(mc) - heapOf(m0) + clients(heapOf)) / n,
		IstiodHeapBytesPerStream:           (float64(ih1) - float64(ih0)) / n,
		ProcessStackBytesPerStream:         (stackOf(m1) - stackOf(m0) + clients(stackOf)) / n,
		IstiodStackBytesPerStream:          (float64(is1) - float64(is0)) / n,
		GoroutinesPerStream:                float64(m1.Goroutines-m0.Goroutines+cr.Held.Goroutines-cr.Base.Goroutines) / n,
		P50Millis:                          ms(quantile(lat, 0.50)),
		P99Millis:                          ms(quantile(lat, 0.99)),
	}
	if *pushHosts > 0 {
		s.LargePushMillis, s.LargePushBytes = largePush(b, ns, p, *pushHosts)
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func run(b *testing.B, n int) result {
	ns, ws := registerAll(b, n)
	// istiod admits 25 new ADS streams per second by default
	// (PILOT_MAX_REQUESTS_PER_SECOND) and fails a stream that waits over 1s
	// with ResourceExhausted; the benchmark opens 1,000 at once on both
	// sides, so the limit is raised for both alike.
	i, err := testenv.StartIstiod(b.Context(), cluster.Env, testenv.IstiodOptions{Env: []string{"PILOT_MAX_REQUESTS_PER_SECOND=100000"}})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = i.Close() }()
	// Both client-facing sides serve TLS with a key of the same kind and
	// size, and the clients verify both.
	chain, err := istiodChain(i)
	if err != nil {
		b.Fatal(err)
	}
	serving, rootPEM, err := servingTLS(chain)
	if err != nil {
		b.Fatal(err)
	}
	r := result{Streams: n, StreamsPerConn: max(1, *perConnFlag)}
	streams := make([]streamClient, len(ws))
	for k, w := range ws {
		streams[k] = streamClient{Token: w.Token, NodeID: w.NodeID}
	}
	direct := clientSpec{Addr: i.SecureGRPCAddr, ServerName: testenv.IstiodServerName, RootsPEM: i.RootCert, PerConn: r.StreamsPerConn, Streams: streams}
	r.Direct = measureSide(b, i, ns, direct, nil, "")
	// Each proxy's direct stream must be gone from istiod before it
	// connects again through Embark (istiod keys connections by proxy).
	time.Sleep(2 * time.Second)
	addr, settle := startEmbark(b, i, serving)
	relayed := clientSpec{Addr: addr, ServerName: embarkServerName, RootsPEM: rootPEM, PerConn: r.StreamsPerConn, Streams: streams}
	r.Relayed = measureSide(b, i, ns, relayed, settle, *flags.HeapProfile)
	r.ClientHeapBytesPerStream = r.Direct.ProcessHeapBytesPerStream
	r.EmbarkHeapBytesPerStream = r.Relayed.ProcessHeapBytesPerStream - r.Direct.ProcessHeapBytesPerStream
	r.EmbarkHeapBytesPerStreamUnsettled = r.Relayed.ProcessHeapBytesPerStreamUnsettled - r.Direct.ProcessHeapBytesPerStream
	if d := r.Direct.IstiodHeapBytesPerStream; d > 0 {
		r.HeapRatio = (r.EmbarkHeapBytesPerStream + r.Relayed.IstiodHeapBytesPerStream) / d
	}
	if d := r.Direct.ProcessHeapBytesPerStream + r.Direct.IstiodHeapBytesPerStream; d > 0 {
		r.HeapRatioWithClients = (r.Relayed.ProcessHeapBytesPerStream + r.Relayed.IstiodHeapBytesPerStream) / d
	}
	r.EmbarkStackBytesPerStream = r.Relayed.ProcessStackBytesPerStream - r.Direct.ProcessStackBytesPerStream
	if d := r.Direct.IstiodHeapBytesPerStream + r.Direct.IstiodStackBytesPerStream; d > 0 {
		r.MemoryRatio = (r.EmbarkHeapBytesPerStream + r.EmbarkStackBytesPerStream + r.Relayed.IstiodHeapBytesPerStream + r.Relayed.IstiodStackBytesPerStream) / d
	}
	r.AddedP50Millis = r.Relayed.P50Millis - r.Direct.P50Millis
	r.AddedP99Millis = r.Relayed.P99Millis - r.Direct.P99Millis
	return r
}

var recorder benchjson.Recorder

func record(r result) {
	s := fmt.Sprintf("streams=%d/per-conn=%d", r.Streams, r.StreamsPerConn)
	recorder.Add(
		benchjson.Result{Name: "RelayedServerHeap/" + s, Unit: "B/stream", Value: r.EmbarkHeapBytesPerStream + r.Relayed.IstiodHeapBytesPerStream, Baseline: "DirectServerHeap/" + s, Note: "Embark + istiod per relayed stream; target <= 1.3x"},
		benchjson.Result{Name: "DirectServerHeap/" + s, Unit: "B/stream", Value: r.Direct.IstiodHeapBytesPerStream, Note: "istiod per direct stream (the same clients, the same TLS)"},
		benchjson.Result{Name: "RelayedHeapWithClients/" + s, Unit: "B/stream", Value: r.Relayed.ProcessHeapBytesPerStream + r.Relayed.IstiodHeapBytesPerStream, Baseline: "DirectHeapWithClients/" + s, Note: "clients + Embark + istiod"},
		benchjson.Result{Name: "DirectHeapWithClients/" + s, Unit: "B/stream", Value: r.Direct.ProcessHeapBytesPerStream + r.Direct.IstiodHeapBytesPerStream, Note: "clients + istiod"},
		benchjson.Result{Name: "EmbarkHeap/" + s, Unit: "B/stream", Value: r.EmbarkHeapBytesPerStream, Note: "Embark alone per relayed stream, its connection writes stored"},
		benchjson.Result{Name: "EmbarkHeapAtConnect/" + s, Unit: "B/stream", Value: r.EmbarkHeapBytesPerStreamUnsettled, Note: "Embark alone per relayed stream right after the connects (connection writes queued)"},
		benchjson.Result{Name: "IstiodHeapRelayed/" + s, Unit: "B/stream", Value: r.Relayed.IstiodHeapBytesPerStream, Note: "istiod alone per relayed stream (Embark's streams share one connection)"},
		benchjson.Result{Name: "ClientHeap/" + s, Unit: "B/stream", Value: r.ClientHeapBytesPerStream, Note: "the benchmark's clients per stream (in neither server figure)"},
		benchjson.Result{Name: "EmbarkStack/" + s, Unit: "B/stream", Value: r.EmbarkStackBytesPerStream, Note: "Embark's goroutine stacks per relayed stream (not heap)"},
		benchjson.Result{Name: "IstiodStackDirect/" + s, Unit: "B/stream", Value: r.Direct.IstiodStackBytesPerStream, Note: "istiod's goroutine stacks per direct stream"},
		benchjson.Result{Name: "IstiodStackRelayed/" + s, Unit: "B/stream", Value: r.Relayed.IstiodStackBytesPerStream, Note: "istiod's goroutine stacks per relayed stream"},
		benchjson.Result{Name: "RelayedGoroutines/" + s, Unit: "goroutines/stream", Value: r.Relayed.GoroutinesPerStream, Baseline: "DirectGoroutines/" + s},
		benchjson.Result{Name: "DirectGoroutines/" + s, Unit: "goroutines/stream", Value: r.Direct.GoroutinesPerStream},
		benchjson.Result{Name: "RelayedP50/" + s, Unit: "ms", Value: r.Relayed.P50Millis, Baseline: "DirectP50/" + s, Note: "RDS subscription to answer"},
		benchjson.Result{Name: "DirectP50/" + s, Unit: "ms", Value: r.Direct.P50Millis},
		benchjson.Result{Name: "RelayedP99/" + s, Unit: "ms", Value: r.Relayed.P99Millis, Baseline: "DirectP99/" + s, Note: "target: under 5 ms added"},
		benchjson.Result{Name: "DirectP99/" + s, Unit: "ms", Value: r.Direct.P99Millis},
	)
	if r.Direct.LargePushBytes > 0 {
		recorder.Add(
			benchjson.Result{Name: "LargePushRelayed/" + s, Unit: "ms", Value: r.Relayed.LargePushMillis, Baseline: "LargePushDirect/" + s,
				Note: fmt.Sprintf("a ServiceEntry of %d hosts written until every relayed stream ACKed its CDS (%d bytes per stream)", *pushHosts, r.Relayed.LargePushBytes)},
			benchjson.Result{Name: "LargePushDirect/" + s, Unit: "ms", Value: r.Direct.LargePushMillis, Note: "the same, every stream straight to istiod"},
			benchjson.Result{Name: "LargePushBytes/" + s, Unit: "B/stream", Value: float64(r.Direct.LargePushBytes), Note: "the pushed CDS response's encoded size"},
		)
	}
}

func BenchmarkRelay(b *testing.B) {
	counts, err := benchkit.Counts("streams", *flags.Streams)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range counts {
		b.Run(fmt.Sprintf("streams=%d/per-conn=%d", n, max(1, *perConnFlag)), func(b *testing.B) {
			for b.Loop() {
				r := run(b, n)
				b.ReportMetric(r.EmbarkHeapBytesPerStream, "embark-heap-B/stream")
				b.ReportMetric(r.EmbarkHeapBytesPerStreamUnsettled, "embark-heap-at-connect-B/stream")
				b.ReportMetric(r.Relayed.IstiodHeapBytesPerStream, "istiod-relayed-heap-B/stream")
				b.ReportMetric(r.Direct.IstiodHeapBytesPerStream, "istiod-direct-heap-B/stream")
				b.ReportMetric(r.ClientHeapBytesPerStream, "client-heap-B/stream")
				b.ReportMetric(r.HeapRatio, "heap-ratio")
				b.ReportMetric(r.HeapRatioWithClients, "heap-ratio-with-clients")
				b.ReportMetric(r.EmbarkStackBytesPerStream, "embark-stack-B/stream")
				b.ReportMetric(r.MemoryRatio, "heap+stack-ratio")
				b.ReportMetric(r.Relayed.P99Millis, "relayed-p99-ms")
				b.ReportMetric(r.Direct.P99Millis, "direct-p99-ms")
				b.ReportMetric(r.AddedP50Millis, "added-p50-ms")
				b.ReportMetric(r.AddedP99Millis, "added-p99-ms")
				if r.Direct.LargePushBytes > 0 {
					b.ReportMetric(r.Relayed.LargePushMillis, "push-relayed-ms")
					b.ReportMetric(r.Direct.LargePushMillis, "push-direct-ms")
					b.ReportMetric(float64(r.Direct.LargePushBytes), "push-B/stream")
				}
				record(r)
			}
		})
	}
	if *flags.JSON != "" {
		if err := recorder.WriteFile(*flags.JSON, "github.com/embark-mesh/embark/benchmarks/relay"); err != nil {
			b.Fatal(err)
		}
	}
}
