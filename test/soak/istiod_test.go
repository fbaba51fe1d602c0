//go:build soak

package soak

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/endpointproc"
	"github.com/embark-mesh/embark/test/testenv"
)

const (
	// istiodDown is how long istiod stays stopped in its restart: long
	// enough for every relayed stream to see its upstream stream fail.
	istiodDown = 5 * time.Second
	// onboardingTokenLifetime is the onboarding token's lifetime
	// (tokenIssuer.jwt.expiration at its minimum): short, as the issue's
	// accelerated soak asks.
	onboardingTokenLifetime = time.Minute
)

// sidecars is how many simulated sidecars the istiod-mode soak holds
// (SOAK_SIDECARS; default 1,000, the fault suite's fleet).
func sidecars(t *testing.T) int {
	t.Helper()
	s := os.Getenv("SOAK_SIDECARS")
	if s == "" {
		return 1000
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 10 {
		t.Fatalf("SOAK_SIDECARS=%q: want a number of sidecars, at least 10", s)
	}
	return n
}

// certTTL is the workload certificate lifetime the sidecars ask for
// (pilot-agent's SECRET_TTL): a tenth of the run, between 45 s and 3 min,
// so that each sidecar renews its certificate many times (every half
// lifetime) in any run. Half of 45 s outlasts istiod's restart (down 5 s,
// then the relay's reconnection back-off) with retries to spare; at 30 s
// a renewal falling due during the restart can miss.
func certTTL(duration time.Duration) time.Duration {
	return min(max(duration/10, 45*time.Second), 3*time.Minute)
}

// istiodSample is one sample of the replica's heap and goroutines.
type istiodSample struct {
	at                                   time.Duration
	heapMiB, heapBeforeGCMiB, goroutines float64
	renewals                             int64
}

// The soak in istiod mode: one replica relays SOAK_SIDECARS simulated
// sidecars' ADS streams to a real istiod and their certificate requests to
// istiod's CA, for SOAK_DURATION. Each sidecar renews its certificate as
// pilot-agent does: a CSR with a fresh key through Embark's CA relay,
// authenticated with its sidecar token, before half of its certificate's
// lifetime (certTTL) has passed, retrying with back-off while the relay or
// istiod refuses. The replica is rolled at a fifth of the run (as in
// TestSoak) and istiod restarted at two fifths. It fails on a certificate
// that expires before its renewal (a failed renewal), a registration lost
// or re-created, a held stream not reconnected after the roll or not
// answered and ACKed again after istiod's restart, or a growing live heap
// or goroutine count after both faults.
func TestSoakIstiodMode(t *testing.T) {
	duration, n := soakDuration(t), sidecars(t)
	// Every sidecar stays connected but through the roll: the longest grace.
	grace := maxGrace
	ttl := certTTL(duration)
	every := max(duration/20, 5*time.Second)
	ctx := t.Context()
	ns := env.Namespace(t)
	if err := endpointproc.CreateFixture(ctx, env.Client, ns); err != nil {
		t.Fatal(err)
	}
	i, err := testenv.StartIstiod(ctx, env, testenv.IstiodOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = i.Close() })
	dir := t.TempDir()
	roots := filepath.Join(dir, "istiod-root-cert.pem")
	if err := os.WriteFile(roots, i.RootCert, 0o600); err != nil {
		t.Fatal(err)
	}
	bin, err := endpointproc.Build(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ca, err := awstest.NewCA("us-east-2")
	if err != nil {
		t.Fatal(err)
	}
	cluster := &endpointproc.Cluster{Binary: bin, Kubeconfig: env.KubeconfigPath, Namespace: ns, CA: ca, GracePeriod: grace, Dir: dir,
		Pprof: true, EventCacheSize: eventCacheSize, Configure: func(cfg *config.Configuration) {
			fleetLimits(cfg)
			cfg.Istiod = config.Istiod{Address: i.SecureGRPCAddr, ServerName: testenv.IstiodServerName, RootCertFile: roots}
			cfg.TokenIssuer.JWT.Expiration = &metav1.Duration{Duration: onboardingTokenLifetime}
		}}
	r, err := cluster.NewReplica("soak-istiod-0")
	if err != nil {
		t.Fatal(err)
	}
	r.Register(t)
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("endpoint log:\n%s", r.LogTail())
		}
	}()

	agents := onboardFleet(t, r, ca, ns, n)
	defer func() {
		for _, a := range agents {
			a.Disconnect()
		}
	}()
	conns := dialPool(t, r.XDS, (n+49)/50)
	for k, a := range agents {
		a.Hold([]*grpc.ClientConn{conns[k%len(conns)]})
	}
	waitAll(t, agents, 3*time.Minute, "every sidecar's stream answered by istiod and ACKed", func(a *endpointproc.Agent) bool { return a.ACKs() > 0 })

	caConn, err := endpointproc.Dial(r.XDS)
	if err != nil {
		t.Fatal(err)
	}
	defer caConn.Close()
	renewers := make([]*renewer, len(agents))
	rctx, stopRenewals := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for k, a := range agents {
		renewers[k] = &renewer{agent: a, ca: securityv1alpha1.NewIstioCertificateServiceClient(caConn), ttl: ttl}
		wg.Go(func() { renewers[k].run(rctx) })
	}
	defer func() { stopRenewals(); wg.Wait() }()
	t.Logf("%d sidecars hold streams relayed to istiod and renew certificates of %v through the CA relay", n, ttl)

	profileDir := os.Getenv("SOAK_PROFILE_DIR")
	if profileDir == "" {
		profileDir = t.TempDir()
	}
	start := time.Now()
	rollAt, restartAt := duration/5, 2*duration/5
	rolled, restarted := false, false
	var report strings.Builder
	var samples []istiodSample
	nextSample := start
	for time.Since(start) < duration {
		time.Sleep(time.Second)
		switch {
		case !rolled && time.Since(start) >= rollAt:
			rolled = true
			rollStart := time.Now()
			if err := r.Stop(); err != nil {
				t.Fatalf("roll: stop: %v", err)
			}
			if err := r.Start(ctx); err != nil {
				t.Fatalf("roll: start: %v", err)
			}
			took := time.Since(rollStart)
			held, lost := checkRoll(ctx, t, ns, agents, grace)
			fmt.Fprintf(&report, "replica rolled at %v (down and ready again in %v): %d of %d streams reconnected, %d registrations lost or re-created\n",
				rollAt, took.Round(100*time.Millisecond), held, n, lost)
			t.Logf("t=%-6s replica rolled: %d streams reconnected, %d registrations lost or re-created", time.Since(start).Round(time.Second), held, lost)
		case !restarted && time.Since(start) >= restartAt:
			restarted = true
			fmt.Fprintf(&report, "%s\n", restartIstiod(t, i, agents))
		}
		if now := time.Now(); !now.Before(nextSample) {
			nextSample = now.Add(every)
			s := sampleReplica(t, r, filepath.Join(profileDir, fmt.Sprintf("istiod-heap-%02d.pb.gz", len(samples)+1)))
			s.at = now.Sub(start)
			for _, rn := range renewers {
				s.renewals += rn.renewals.Load()
			}
			samples = append(samples, s)
			t.Logf("t=%-6s live heap %6.1f MiB (in use before GC %6.1f)  goroutines %5.0f  certificates renewed %6d",
				s.at.Round(time.Second), s.heapMiB, s.heapBeforeGCMiB, s.goroutines, s.renewals)
		}
	}
	stopRenewals()
	wg.Wait()

	checkRenewals(t, renewers, &report)
	lost := lostRegistrations(ctx, t, ns, agents)
	fmt.Fprintf(&report, "at the end: %d sidecars, %d registrations lost or re-created or not connected\n", n, lost)

	// Flatness: from a tenth of the run after istiod's restart (its
	// resynchronisation done) to the end.
	var xs, heap, inuse, gor []float64
	for _, s := range samples {
		if s.at < restartAt+duration/10 {
			continue
		}
		xs = append(xs, s.at.Minutes())
		heap = append(heap, s.heapMiB)
		inuse = append(inuse, s.heapBeforeGCMiB)
		gor = append(gor, s.goroutines)
	}
	if len(xs) < 5 {
		t.Fatalf("%d samples after istiod's restart: too few to tell a trend (SOAK_DURATION of at least 2m)", len(xs))
	}
	fmt.Fprintf(&report, "%d samples, %d after istiod's restart checked\n", len(samples), len(xs))
	checkTrends(t, &report, xs, heap, gor, inuse)
	t.Logf("\nsoak in istiod mode %v: %d sidecars, certificate TTL %v, onboarding token lifetime %v\n%s",
		duration, n, ttl, onboardingTokenLifetime, report.String())
}

// fleetLimits raises the replica's per-source limits, sized for one host
// each, so that a whole simulated fleet connects and onboards from one
// loopback address (as the fault suite's replicas do).
func fleetLimits(cfg *config.Configuration) {
	cfg.Limits.Onboarding.RequestsPerSecondPerSource = 100000
	cfg.Limits.Onboarding.RequestBurstPerSource = 100000
	cfg.Limits.XDS.RequestsPerSecondPerSource = 100000
	cfg.Limits.XDS.RequestBurstPerSource = 100000
	cfg.Limits.XDS.MaxConnectionsPerSource = 1000
	cfg.Registration.VerifyPerSecond = -1
}

// onboardFleet onboards n simulated sidecars through r, 16 at a time.
func onboardFleet(t *testing.T, r *endpointproc.Replica, ca *awstest.CA, ns string, n int) []*endpointproc.Agent {
	t.Helper()
	conn, err := endpointproc.Dial(r.Onboarding)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := onboardingv1alpha1.NewOnboardingServiceClient(conn)
	out := make([]*endpointproc.Agent, n)
	for k := range out {
		out[k] = endpointproc.NewAgent(10000 + k)
	}
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		first atomic.Pointer[error]
	)
	for range min(n, 16) {
		wg.Go(func() {
			for k := int(next.Add(1)) - 1; k < n; k = int(next.Add(1)) - 1 {
				if err := out[k].Onboard(t.Context(), api, ca, ns, endpointproc.Group); err != nil {
					first.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := first.Load(); err != nil {
		t.Fatal(*err)
	}
	return out
}

// dialPool opens k connections to addr: the server runs at most 100
// streams on one, so the fleet is spread over several.
func dialPool(t *testing.T, addr string, k int) []*grpc.ClientConn {
	t.Helper()
	var out []*grpc.ClientConn
	for range max(k, 1) {
		c, err := endpointproc.Dial(addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		out = append(out, c)
	}
	return out
}

// waitAll waits until ok holds for every agent.
func waitAll(t *testing.T, agents []*endpointproc.Agent, timeout time.Duration, what string, ok func(*endpointproc.Agent) bool) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		missing := 0
		for _, a := range agents {
			if !ok(a) {
				missing++
			}
		}
		if missing == 0 {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s: %d of %d sidecars not after %v", what, missing, len(agents), timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// restartIstiod stops istiod for istiodDown and starts it again, then
// waits until every sidecar's stream is answered by the new istiod and
// ACKed again, without the stream to Embark being re-opened. It returns
// the report's line.
func restartIstiod(t *testing.T, i *testenv.Istiod, agents []*endpointproc.Agent) string {
	t.Helper()
	connects, acks := make([]int64, len(agents)), make([]int64, len(agents))
	for k, a := range agents {
		connects[k], acks[k] = a.Connects(), a.ACKs()
	}
	i.Stop()
	time.Sleep(istiodDown)
	start := time.Now()
	if err := i.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	ready := time.Since(start)
	index := map[*endpointproc.Agent]int{}
	for k, a := range agents {
		index[a] = k
	}
	took := waitAll(t, agents, 3*time.Minute, "every stream answered and ACKed again after istiod's restart",
		func(a *endpointproc.Agent) bool { return a.ACKs() > acks[index[a]] })
	reopened := 0
	for k, a := range agents {
		if a.Connects() != connects[k] || !a.Connected() {
			reopened++
			t.Errorf("%s: its stream to Embark was re-opened (%d streams, %d before) or is closed (%v) across istiod's restart", a.Registration, a.Connects(), connects[k], a.LastError())
		}
	}
	t.Logf("istiod restarted (down %v, ready in %v): all %d streams ACKed again %v after its start; %d re-opened to Embark",
		istiodDown, ready.Round(time.Millisecond), len(agents), (ready + took).Round(time.Millisecond), reopened)
	return fmt.Sprintf("istiod restarted (down %v, ready again in %v): all %d relayed streams answered and ACKed again %v after its start, %d streams to Embark re-opened",
		istiodDown, ready.Round(100*time.Millisecond), len(agents), (ready + took).Round(100*time.Millisecond), reopened)
}

// sampleReplica takes a heap profile of r (a full collection first) into
// path and reads its live heap, heap in use before the collection and
// goroutines.
func sampleReplica(t *testing.T, r *endpointproc.Replica, path string) istiodSample {
	t.Helper()
	before, err := r.Scrape("go_memstats_heap_inuse_bytes")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.HeapProfile(path); err != nil {
		t.Fatal(err)
	}
	m, err := r.Scrape("go_gc_heap_live_bytes", "go_goroutines")
	if err != nil {
		t.Fatal(err)
	}
	return istiodSample{heapMiB: m["go_gc_heap_live_bytes"] / (1 << 20), goroutines: m["go_goroutines"],
		heapBeforeGCMiB: before["go_memstats_heap_inuse_bytes"] / (1 << 20)}
}

// lostRegistrations counts the sidecars whose registration is missing,
// re-created (another UID), without its WorkloadEntry or not connected,
// each an error.
func lostRegistrations(ctx context.Context, t *testing.T, ns string, agents []*endpointproc.Agent) int {
	t.Helper()
	ws, err := endpointproc.Workloads(ctx, env.Client, ns)
	if err != nil {
		t.Fatal(err)
	}
	lost := 0
	for _, a := range agents {
		if w, ok := ws[a.Registration]; !ok || w.Connected != "True" || !w.WorkloadEntry || string(w.UID) != a.UID {
			lost++
			t.Errorf("%s (UID %s): registration %+v (present %v), stream connected %v, last error %v", a.Registration, a.UID, w, ok, a.Connected(), a.LastError())
		}
	}
	return lost
}

// renewer keeps one sidecar's workload certificate valid as pilot-agent
// does: it asks Embark's CA relay for a certificate of lifetime ttl with
// a fresh key and the sidecar token, and again once half of the
// certificate's remaining lifetime has passed; a refused request is retried with
// back-off (1 s doubling to 4 s). A certificate that expires before its
// replacement arrives is a failed renewal.
type renewer struct {
	agent *endpointproc.Agent
	ca    securityv1alpha1.IstioCertificateServiceClient
	ttl   time.Duration

	renewals atomic.Int64 // certificates received
	failed   atomic.Int64 // certificates expired before their renewal
	mu       sync.Mutex
	refusals map[string]int // refused attempts by gRPC code (retried)
	lastErr  error
}

func (r *renewer) run(ctx context.Context) {
	// The first requests are spread over an eighth of the lifetime, as a
	// fleet's sidecars start at different times.
	wait := mrand.N(r.ttl / 8)
	var expires time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		notAfter, err := r.request(ctx)
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		if !expires.IsZero() && now.After(expires) {
			r.failed.Add(1)
		}
		if err != nil {
			r.refused(err)
			wait = backoff(wait)
			if !expires.IsZero() && now.After(expires) {
				expires = time.Time{} // counted once; the next certificate starts again
			}
			continue
		}
		r.renewals.Add(1)
		// istiod backdates a certificate's NotBefore, so half of its
		// lifetime is counted from its arrival, not from NotBefore.
		expires = notAfter
		wait = notAfter.Sub(now)/2 + mrand.N(time.Second)
	}
}

// backoff is the next retry delay after one of wait: 1 s, doubling up to 4 s.
func backoff(wait time.Duration) time.Duration {
	if wait < time.Second || wait > 4*time.Second {
		return time.Second
	}
	return min(2*wait, 4*time.Second)
}

func (r *renewer) refused(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refusals == nil {
		r.refusals = map[string]int{}
	}
	r.refusals[status.Code(err).String()]++
	r.lastErr = err
}

// request asks the CA relay for a certificate and returns when its leaf
// expires.
func (r *renewer) request(ctx context.Context) (notAfter time.Time, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return notAfter, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{Organization: []string{"soak"}}}, key)
	if err != nil {
		return notAfter, err
	}
	csr := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+r.agent.Token()), 30*time.Second)
	defer cancel()
	resp, err := r.ca.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: int64(r.ttl / time.Second)})
	if err != nil {
		return notAfter, err
	}
	if len(resp.GetCertChain()) == 0 {
		return notAfter, errors.New("no certificate chain")
	}
	block, _ := pem.Decode([]byte(resp.GetCertChain()[0]))
	if block == nil {
		return notAfter, errors.New("certificate chain: no PEM block")
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return notAfter, err
	}
	return leaf.NotAfter, nil
}

// checkRenewals fails on any failed renewal and on a sidecar that renewed
// fewer than twice, and reports the renewals and the refused attempts.
func checkRenewals(t *testing.T, rs []*renewer, report *strings.Builder) {
	t.Helper()
	var total, failed int64
	least := int64(-1)
	refusals := map[string]int{}
	for _, r := range rs {
		got, f := r.renewals.Load(), r.failed.Load()
		total += got
		failed += f
		if least < 0 || got < least {
			least = got
		}
		r.mu.Lock()
		for c, k := range r.refusals {
			refusals[c] += k
		}
		if f > 0 {
			t.Errorf("%s: %d certificates expired before their renewal (last refusal %v)", r.agent.Registration, f, r.lastErr)
		}
		r.mu.Unlock()
		if got < 3 {
			t.Errorf("%s: %d certificates in the run, want a first one and at least two renewals", r.agent.Registration, got)
		}
	}
	fmt.Fprintf(report, "certificates: %d issued through the CA relay (at least %d per sidecar), %d failed renewals; refused attempts (retried) %v\n",
		total, least, failed, refusals)
}
