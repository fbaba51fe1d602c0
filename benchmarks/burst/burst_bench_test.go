// Package burst benchmarks a scale-out in istiod mode: N simulated VMs
// started at once against a real endpoint (app.Run, in this process) and a
// real istiod, each joining the mesh as a VM does, next to the bound
// computed in the same run from what the API server and istiod alone do
// for the same work:
//
//	go test -run='^$' -bench=Burst -benchtime=1x ./benchmarks/burst/ -args -vms=100,500 -json=burst.json
//
// Each VM: Authorize + Register (the onboarding API, its EC2 identity
// document signed by a test CA), then at once its workload certificate
// from istiod through Embark's CA relay (a refusal of the relay's rate or
// in-flight limit retried with a backoff, as pilot-agent retries) and its
// ADS stream through Embark's xDS relay with CDS and LDS each answered and
// ACKed. A VM is a mesh member when both are done. Figures: the time until
// the last VM is a member (Burst/vms=N), p50 and p99 of a VM's time to
// member, and the bound:
//
//   - BurstRawAPI: the API server's own time for the same API calls: the
//     objects Embark stored in the burst (every registration, WorkloadEntry
//     and sidecar credential Secret, read back and stripped of their server
//     fields) created again in a fresh namespace, plus one TokenRequest of
//     the same audiences and lifetime bound to each Secret, N clients at
//     once with the endpoint's client rate limit (three requests per write
//     of the default write budget), each VM's calls one after another;
//   - BurstIstiodSigning: istiod's own time to sign the same certificate
//     requests (the same CSRs, the VMs' own tokens) sent straight to its
//     secure port, N clients at once, each on its own connection;
//   - BurstBound = BurstRawAPI + BurstIstiodSigning; target: Burst ≤ 1.25 ×
//     BurstBound (benchmarks/report/targets.go, at 500 VMs).
//
// The bound leaves out what the burst also does: the two connection writes
// per VM Embark stores once its stream is up (registration status and
// WorkloadEntry), istiod computing each VM's configuration, and the
// endpoint's own CPU; they are part of the burst's figure, so the bound is
// a lower bound. The baselines run after the burst, once its streams are
// closed and the endpoint stopped (its disconnect writes stored).
//
// BenchmarkRenewals (renewals_bench_test.go) measures certificate renewals
// through the CA relay at scale: -renewals sidecars, -renew-rate.
//
// Other flags:
// -istiod-cpuprofile=file and -apiserver-cpuprofile=file write istiod's
// and the kube-apiserver's CPU profiles of the burst's first
// -profile-seconds (default 10) to file.vms=N; go test's own -cpuprofile
// profiles this process (the endpoint and the simulated VMs).
//
//embark:bench -test.benchtime=1x -vms=100,500 -renewals=1000 -ca-budget=1000
package burst

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/embark-mesh/embark/benchmarks/benchjson"
	"github.com/embark-mesh/embark/benchmarks/internal/benchkit"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/endpointproc"
	"github.com/embark-mesh/embark/test/testenv"
)

var (
	vmsFlag         = flag.String("vms", "100", "comma-separated numbers of VMs started at once")
	jsonFlag        = benchjson.Flag()
	istiodProfile   = flag.String("istiod-cpuprofile", "", "write istiod's CPU profile of the burst's first -profile-seconds to this file (.vms=N appended)")
	apiProfile      = flag.String("apiserver-cpuprofile", "", "write the kube-apiserver's CPU profile of the burst's first -profile-seconds to this file (.vms=N appended)")
	caBudget        = flag.Float64("ca-budget", 0, "the endpoint's CA relay budget (istiod.certificateRelay: requests/s and burst the same, 256 in flight); 0: the endpoint's defaults (50/s, burst 100, 64)")
	profileSeconds  = flag.Int("profile-seconds", 10, "length of the -istiod-cpuprofile and -apiserver-cpuprofile profiles")
	identityCA      *awstest.CA
	instanceNumbers atomic.Int64
	recorder        benchjson.Recorder
)

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{GarbageCollector: true}, &cluster.Env, func(context.Context) error {
		var err error
		identityCA, err = awstest.NewCA("us-east-2")
		return err
	})
}

// burstResult is one burst's figures.
type burstResult struct {
	vms int
	// total is the time until the last VM was a member; members each
	// VM's times, sorted by member time.
	total   time.Duration
	members []times
	retries int
	// rawAPI and signing are the baselines' times, bound their sum.
	rawAPI, signing, bound time.Duration
	// apiCalls is the number of API calls of the raw baseline.
	apiCalls int
	// writesPerVM is the API server's count of the write requests it
	// served during the burst (apiWrites) per VM, writesDetail them by
	// verb and resource.
	writesPerVM  float64
	writesDetail string
}

func BenchmarkBurst(b *testing.B) {
	counts, err := benchkit.Counts("vms", *vmsFlag)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range counts {
		b.Run(fmt.Sprintf("vms=%d", n), func(b *testing.B) {
			for b.Loop() {
				r := burst(b, n)
				report(b, r)
			}
		})
	}
	if *jsonFlag != "" {
		if err := recorder.WriteFile(*jsonFlag, "github.com/embark-mesh/embark/benchmarks/burst"); err != nil {
			b.Fatal(err)
		}
	}
}

// burst runs one burst of n VMs and its baselines.
func burst(b *testing.B, n int) burstResult {
	ctx := b.Context()
	// The namespace controller removing an earlier burst's objects would
	// share the API server with this one.
	if err := namespacesGone(ctx); err != nil {
		b.Fatal(err)
	}
	ns := cluster.Env.Namespace(b)
	if err := endpointproc.CreateFixture(ctx, cluster.Env.Client, ns); err != nil {
		b.Fatal(err)
	}
	services(b, ns)
	vms := makeVMs(b, n)
	d := startDeployment(b, ns, identityCA)

	r := burstResult{vms: n, members: make([]times, n)}
	cs, err := kubernetes.NewForConfig(cluster.Env.Config)
	if err != nil {
		b.Fatal(err)
	}
	writesBefore, err := apiWrites(ctx, cs)
	if err != nil {
		b.Fatal(err)
	}
	stopProfiles := startProfiles(b, d, cs, n)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i, v := range vms {
		wg.Go(func() {
			t, err := v.join(ctx, d, start)
			if err != nil {
				errs <- err
				return
			}
			r.members[i] = t
		})
	}
	wg.Wait()
	r.total = time.Since(start)
	writesAfter, err := apiWrites(ctx, cs)
	if err != nil {
		b.Fatal(err)
	}
	r.writesPerVM, r.writesDetail = writesPerVM(writesBefore, writesAfter, n)
	stopProfiles()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatalf("%v (and %d more failures)", err, len(errs))
	}
	for _, v := range vms {
		r.retries += int(v.retries.Load())
		v.close()
	}
	slices.SortFunc(r.members, func(a, b times) int { return int(a.member - b.member) })
	// The endpoint stores the disconnects before it stops: the
	// baselines run with nothing else writing.
	d.ep.Stop()
	r.rawAPI, r.apiCalls = rawAPI(b, ns, vms)
	r.signing = directSigning(b, d, vms)
	r.bound = r.rawAPI + r.signing
	return r
}

// makeVMs makes n VMs with their identity documents signed and their
// certificate requests made, before anything is timed.
func makeVMs(b *testing.B, n int) []*vm {
	b.Helper()
	reqs, err := csrs(n)
	if err != nil {
		b.Fatal(err)
	}
	vms := make([]*vm, n)
	for i := range vms {
		if vms[i], err = newVM(identityCA, int(instanceNumbers.Add(1)), reqs[i]); err != nil {
			b.Fatal(err)
		}
	}
	return vms
}

// startProfiles starts the CPU profiles of istiod and the kube-apiserver
// the flags ask for; the returned func waits for them and writes them.
func startProfiles(b *testing.B, d *deployment, cs kubernetes.Interface, n int) func() {
	b.Helper()
	type profile struct {
		file string
		body []byte
		err  error
	}
	var ch []chan profile
	fetch := func(file string, get func() ([]byte, error)) {
		c := make(chan profile, 1)
		ch = append(ch, c)
		go func() { // reports only through c: it may outlive a failed run
			body, err := get()
			c <- profile{file, body, err}
		}()
	}
	suffix := fmt.Sprintf(".vms=%d", n)
	if *istiodProfile != "" {
		fetch(*istiodProfile+suffix, func() ([]byte, error) {
			resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", d.istiod.HTTPAddr, *profileSeconds))
			if err != nil {
				return nil, err
			}
			defer func() { _ = resp.Body.Close() }()
			if resp.StatusCode != http.StatusOK {
				return nil, fmt.Errorf("istiod CPU profile: HTTP %d", resp.StatusCode)
			}
			return io.ReadAll(resp.Body)
		})
	}
	if *apiProfile != "" {
		fetch(*apiProfile+suffix, func() ([]byte, error) {
			return cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", fmt.Sprint(*profileSeconds)).DoRaw(context.Background())
		})
	}
	return func() {
		for _, c := range ch {
			p := <-c
			if p.err != nil {
				b.Fatalf("CPU profile %s: %v", p.file, p.err)
			}
			if err := os.WriteFile(p.file, p.body, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// quantile of sorted durations.
func quantile(d []time.Duration, q float64) time.Duration {
	return d[min(len(d)-1, int(q*float64(len(d))))]
}

// report reports r to the benchmark and the recorder.
func report(b *testing.B, r burstResult) {
	member, onboarded, certified := make([]time.Duration, r.vms), make([]time.Duration, r.vms), make([]time.Duration, r.vms)
	for i, t := range r.members {
		member[i], onboarded[i], certified[i] = t.member, t.onboarded, t.certified
	}
	slices.Sort(onboarded)
	slices.Sort(certified)
	s := fmt.Sprintf("vms=%d", r.vms)
	ratio := r.total.Seconds() / r.bound.Seconds()
	b.ReportMetric(r.total.Seconds(), "s-to-last-member")
	b.ReportMetric(r.bound.Seconds(), "bound-s")
	b.ReportMetric(ratio, "ratio-to-bound")
	b.ReportMetric(ms(quantile(member, 0.5)), "member-p50-ms")
	b.ReportMetric(ms(quantile(member, 0.99)), "member-p99-ms")
	b.ReportMetric(r.rawAPI.Seconds(), "raw-api-s")
	b.ReportMetric(r.signing.Seconds(), "istiod-signing-s")
	b.ReportMetric(float64(r.retries)/float64(r.vms), "csr-retries/vm")
	b.ReportMetric(r.writesPerVM, "api-writes/vm")
	b.ReportMetric(float64(r.apiCalls)/float64(r.vms), "raw-api-calls/vm")
	recorder.Add(
		benchjson.Result{Name: "Burst/" + s, Unit: "s", Value: r.total.Seconds(), Baseline: "BurstBound/" + s,
			Note: "time until the last of the VMs started at once is a mesh member (onboarded, certified through the CA relay, CDS and LDS ACKed through the xDS relay); target <= 1.25x the bound"},
		benchjson.Result{Name: "BurstBound/" + s, Unit: "s", Value: r.bound.Seconds(), Note: "BurstRawAPI + BurstIstiodSigning, same run"},
		benchjson.Result{Name: "BurstRawAPI/" + s, Unit: "s", Value: r.rawAPI.Seconds(),
			Note: fmt.Sprintf("the API server's own time for the burst's %d API calls (its stored objects created again, a TokenRequest per Secret), the endpoint's client rate limit", r.apiCalls)},
		benchjson.Result{Name: "BurstIstiodSigning/" + s, Unit: "s", Value: r.signing.Seconds(), Note: "istiod's own time to sign the same CSRs sent straight to it, all at once"},
		benchjson.Result{Name: "BurstMemberP50/" + s, Unit: "ms", Value: ms(quantile(member, 0.5)), Note: "a VM's time from the burst's start to mesh member"},
		benchjson.Result{Name: "BurstMemberP99/" + s, Unit: "ms", Value: ms(quantile(member, 0.99))},
		benchjson.Result{Name: "BurstOnboardedP99/" + s, Unit: "ms", Value: ms(quantile(onboarded, 0.99)), Note: "Authorize + Register done"},
		benchjson.Result{Name: "BurstCertifiedP99/" + s, Unit: "ms", Value: ms(quantile(certified, 0.99)), Note: "workload certificate received through the CA relay"},
		benchjson.Result{Name: "BurstAPIWrites/" + s, Unit: "writes/vm", Value: r.writesPerVM,
			Note: fmt.Sprintf("write requests the API server served during the burst (its apiserver_request_total, anyone's), per VM, against the bound's %.1f calls per VM: %s", float64(r.apiCalls)/float64(r.vms), r.writesDetail)},
		benchjson.Result{Name: "BurstCSRRetries/" + s, Unit: "retries/vm", Value: float64(r.retries) / float64(r.vms), Note: "certificate requests refused by the CA relay's rate or in-flight limit and sent again"},
	)
}
