package burst

import (
	"flag"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/embark-mesh/embark/benchmarks/benchjson"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/test/endpointproc"
)

// BenchmarkRenewals: -renewals onboarded sidecars (default 1,000) each
// renew their workload certificate once, at -renew-rate renewals a second
// spread evenly (open loop: a renewal starts on time whatever the others
// do, as sidecars renew on their own clocks) through Embark's CA relay
// and, interleaved with those (half an interval later, so that both ways
// meet the same API server and istiod), the same CSRs with the same tokens
// straight to istiod's secure port at the same offered rate. Each sidecar
// uses its own connection each way, established before the clock starts
// (pilot-agent keeps its CA connection). A refusal of the relay's rate or in-flight limit is
// retried as pilot-agent does and counted; a renewal that never succeeds
// is a failure, and any failure fails the benchmark.
//
// The default rate, 40/s, is 0.8 of the relay's default budget (50/s,
// burst 100): 1,000 sidecars whose certificates live about 50 s renew at
// that rate (they renew at half their lifetime), the fault suite's
// short-TTL load. Figures: renewals/s completed both ways
// (Renewals/sidecars=N, RenewalsDirect/sidecars=N), p50 and p99 of a
// renewal's time (retries included) both ways and the difference
// (RenewalAddedP99), failures and retries.
func BenchmarkRenewals(b *testing.B) {
	n := *renewalsFlag
	if n <= 0 || *renewRateFlag <= 0 {
		b.Fatalf("-renewals=%d -renew-rate=%v: want positive values", n, *renewRateFlag)
	}
	b.Run(fmt.Sprintf("sidecars=%d", n), func(b *testing.B) {
		for b.Loop() {
			reportRenewals(b, n, renewals(b, n))
		}
	})
	if *jsonFlag != "" {
		if err := recorder.WriteFile(*jsonFlag, "github.com/embark-mesh/embark/benchmarks/burst"); err != nil {
			b.Fatal(err)
		}
	}
}

var (
	renewalsFlag  = flag.Int("renewals", 1000, "sidecars renewing their certificates in BenchmarkRenewals")
	renewRateFlag = flag.Float64("renew-rate", 40, "renewals a second offered in BenchmarkRenewals, both ways")
)

// renewalSide is one way's figures.
type renewalSide struct {
	rate              float64 // renewals completed per second
	p50, p99          time.Duration
	failures, retries int
}

// renewals onboards n sidecars (untimed) and measures their renewals
// relayed and direct, interleaved (renewAll).
func renewals(b *testing.B, n int) [2]renewalSide {
	ctx := b.Context()
	ns := cluster.Env.Namespace(b)
	if err := endpointproc.CreateFixture(ctx, cluster.Env.Client, ns); err != nil {
		b.Fatal(err)
	}
	vms := makeVMs(b, n)
	d := startDeployment(b, ns, identityCA)
	onboardAll(b, d, vms)
	relayed := dialAll(b, d.ep.Config.Listen.XDS, credentials.NewTLS(d.tlsConfig()), n)
	direct := dialAll(b, d.istiod.SecureGRPCAddr, credentials.NewTLS(d.istiodTLS()), n)
	return renewAll(b, d, vms, [2][]*grpc.ClientConn{relayed, direct})
}

// onboardAll onboards vms through the endpoint, 32 at a time.
func onboardAll(b *testing.B, d *deployment, vms []*vm) {
	b.Helper()
	conn, err := grpc.NewClient(d.ep.Config.Listen.Onboarding, grpc.WithTransportCredentials(credentials.NewTLS(d.tlsConfig())))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	api := onboardingv1alpha1.NewOnboardingServiceClient(conn)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(vms); i = int(next.Add(1)) - 1 {
				if err := vms[i].onboard(b.Context(), api, d.ns); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// dialAll opens n connections to addr and waits until they are ready.
func dialAll(b *testing.B, addr string, creds credentials.TransportCredentials, n int) []*grpc.ClientConn {
	b.Helper()
	conns := make([]*grpc.ClientConn, n)
	for i := range conns {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
		conns[i] = c
	}
	ready(b, conns)
	return conns
}

// renewAll renews every VM's certificate both ways, interleaved so that
// both meet the same API server and istiod (the onboarding's aftermath, a
// collection): vms[i] through the relay on conns[0][i] at i / -renew-rate
// seconds, and straight to istiod on conns[1][i] half an interval later.
// Each way is offered -renew-rate renewals a second.
func renewAll(b *testing.B, d *deployment, vms []*vm, conns [2][]*grpc.ClientConn) [2]renewalSide {
	b.Helper()
	ctx := b.Context()
	var took [2][]time.Duration
	var failures, retries [2]atomic.Int64
	var firstErr [2]error
	var once [2]sync.Once
	interval := time.Duration(float64(time.Second) / *renewRateFlag)
	var wg sync.WaitGroup
	start := time.Now()
	for side := range 2 {
		took[side] = make([]time.Duration, len(vms))
	}
	for i, v := range vms {
		for side := range 2 {
			at := start.Add(time.Duration(i)*interval + time.Duration(side)*interval/2)
			if wait := time.Until(at); wait > 0 {
				time.Sleep(wait)
			}
			wg.Go(func() {
				t0 := time.Now()
				_, err := v.certificate(ctx, securityv1alpha1.NewIstioCertificateServiceClient(conns[side][i]), d.istiod.RootPool(), &retries[side])
				took[side][i] = time.Since(t0)
				if err != nil {
					failures[side].Add(1)
					once[side].Do(func() { firstErr[side] = err })
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	var out [2]renewalSide
	for side, name := range []string{"relayed", "direct"} {
		if firstErr[side] != nil {
			b.Errorf("%s: %d of %d renewals failed; the first: %v", name, failures[side].Load(), len(vms), firstErr[side])
		}
		slices.Sort(took[side])
		out[side] = renewalSide{rate: float64(len(vms)) / elapsed.Seconds(), p50: quantile(took[side], 0.5), p99: quantile(took[side], 0.99),
			failures: int(failures[side].Load()), retries: int(retries[side].Load())}
	}
	return out
}

func reportRenewals(b *testing.B, n int, r [2]renewalSide) {
	relayed, direct := r[0], r[1]
	s := fmt.Sprintf("sidecars=%d", n)
	added := ms(relayed.p99) - ms(direct.p99)
	b.ReportMetric(relayed.rate, "relayed-renewals/s")
	b.ReportMetric(direct.rate, "direct-renewals/s")
	b.ReportMetric(ms(relayed.p99), "relayed-p99-ms")
	b.ReportMetric(ms(direct.p99), "direct-p99-ms")
	b.ReportMetric(added, "added-p99-ms")
	b.ReportMetric(float64(relayed.failures), "failed-renewals")
	b.ReportMetric(float64(relayed.retries), "relayed-retries")
	recorder.Add(
		benchjson.Result{Name: "Renewals/" + s, Unit: "renewals/s", Value: relayed.rate, Baseline: "RenewalsDirect/" + s,
			Note: fmt.Sprintf("certificate renewals completed per second through Embark's CA relay, %.0f/s offered", *renewRateFlag)},
		benchjson.Result{Name: "RenewalsDirect/" + s, Unit: "renewals/s", Value: direct.rate, Note: "the same CSRs straight to istiod, same offered rate"},
		benchjson.Result{Name: "RenewalP50/" + s, Unit: "ms", Value: ms(relayed.p50), Baseline: "RenewalDirectP50/" + s},
		benchjson.Result{Name: "RenewalDirectP50/" + s, Unit: "ms", Value: ms(direct.p50)},
		benchjson.Result{Name: "RenewalP99/" + s, Unit: "ms", Value: ms(relayed.p99), Baseline: "RenewalDirectP99/" + s, Note: "a renewal's time through the relay, its retries included"},
		benchjson.Result{Name: "RenewalDirectP99/" + s, Unit: "ms", Value: ms(direct.p99)},
		benchjson.Result{Name: "RenewalAddedP99/" + s, Unit: "ms", Value: added, Note: "relayed p99 - direct p99"},
		benchjson.Result{Name: "RenewalFailures/" + s, Unit: "renewals", Value: float64(relayed.failures + direct.failures), Note: "renewals that never succeeded, both ways; target 0"},
		benchjson.Result{Name: "RenewalRetries/" + s, Unit: "requests", Value: float64(relayed.retries), Note: "requests refused by the relay's rate or in-flight limit and sent again"},
	)
}
