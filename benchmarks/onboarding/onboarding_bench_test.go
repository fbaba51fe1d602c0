// Package onboarding benchmarks whole onboardings (Authorize + Register
// through the gRPC API) against a real kube-apiserver + etcd, next to the
// API server's raw create rate of the same objects measured in the same run.
//
//	go test -run='^$' -bench=. -benchtime=1500x ./benchmarks/onboarding/
//
// (`make bench` passes the benchtime of the directive at the end of this
// comment: at 200 concurrent agents each agent onboards 7 or 8 times. With
// 400 per run, as before 2026-11-28, a run at 50 agents lasted under 3 s and
// its rate moved by a third between runs; 1,500 last about 10 s.)
//
// Each benchmark reports onboardings/s (or creates/s), p50-ms and p99-ms of
// one operation, and for onboardings the stored API writes and the
// TokenRequests (not stored) per onboarding.
//
// -apiserver-cpuprofile=file writes the kube-apiserver's CPU profile (its
// /debug/pprof) of the first -apiserver-profile-seconds (default 5) of
// Onboarding/agents=50 to file and of Onboarding/raw/clients=50 to file.raw; give
// a -benchtime long enough that both runs outlast it (e.g. 2000x), so that
// each profile covers its run only. The profiles' total samples divided by
// the API calls made while they ran is the API server's CPU per call.
//
//embark:bench -test.benchtime=1500x
package onboarding

import (
	"context"
	"crypto/x509"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/endpoint"
	awsidentity "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/policy"
	"github.com/embark-mesh/embark/onboarding/token"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/write"
	"github.com/embark-mesh/embark/test/testenv"
)

const audience = "onboarding-endpoint.bench"

var (
	apiProfile        = flag.String("apiserver-cpuprofile", "", "write the kube-apiserver's CPU profile during Onboarding/agents=50 to this file and during Onboarding/raw/clients=50 to file.raw")
	apiProfileSeconds = flag.Int("apiserver-profile-seconds", 5, "length of each -apiserver-cpuprofile profile")

	env    *testenv.Env
	cached cache.Cache
	ca     *awstest.CA
)

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{}, &env, func(ctx context.Context) error {
		var err error
		if ca, err = awstest.NewCA("us-east-2"); err != nil {
			return err
		}
		cached, err = env.StartCache(ctx, func(c cache.Cache) error { return registry.SetupIndexes(ctx, c) },
			&istionetworkingv1.WorkloadEntryList{}, &istionetworkingv1.WorkloadGroupList{}, &authorizationv1alpha1.OnboardingPolicyList{},
			&runtimev1alpha1.WorkloadAutoRegistrationList{}, &corev1.ServiceAccountList{})
		if err != nil {
			return err
		}
		return nil
	})
}

// writeCounter counts the API writes made through a client: n the writes
// the API server stores, tokens the TokenRequests (creates on the
// serviceaccounts/token subresource, which are not stored).
type writeCounter struct {
	n, tokens atomic.Int64
	// reads are the GETs made through the client (served from the
	// informer cache, as in the endpoint).
	reads atomic.Int64
	// took sums the time of each create by kind ("TokenRequest" for the
	// token subresource), to say where an onboarding's time goes.
	mu   sync.Mutex
	took map[string]time.Duration
}

func (w *writeCounter) timed(kind string, t0 time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.took == nil {
		w.took = map[string]time.Duration{}
	}
	w.took[kind] += time.Since(t0)
}

func (w *writeCounter) wrap(c client.WithWatch) client.WithWatch {
	count := func() { w.n.Add(1) }
	return interceptor.NewClient(c, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			w.reads.Add(1)
			defer w.timed("get-"+fmt.Sprintf("%T", obj)[1:], time.Now())
			return c.Get(ctx, key, obj, opts...)
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			count()
			defer w.timed(fmt.Sprintf("%T", obj)[1:], time.Now())
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			count()
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			count()
			return c.Patch(ctx, obj, p, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			count()
			return c.Delete(ctx, obj, opts...)
		},
		SubResourceCreate: func(ctx context.Context, c client.Client, sub string, obj, subObj client.Object, opts ...client.SubResourceCreateOption) error {
			if sub == "token" {
				w.tokens.Add(1)
				defer w.timed("TokenRequest", time.Now())
			} else {
				count()
			}
			return c.SubResource(sub).Create(ctx, obj, subObj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			count()
			defer w.timed(fmt.Sprintf("%T", obj)[1:]+"-"+sub, time.Now())
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			count()
			return c.SubResource(sub).Patch(ctx, obj, p, opts...)
		},
	})
}

// stack is an onboarding endpoint served on loopback for one benchmark.
type stack struct {
	api    onboardingv1alpha1.OnboardingServiceClient
	writes *writeCounter
	ns     string
}

func newStack(b *testing.B) *stack {
	b.Helper()
	ctx := b.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { emptyNamespace(b, context.WithoutCancel(ctx), ns.Name) })
	wg := &istionetworkingv1.WorkloadGroup{ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: ns.Name, Labels: map[string]string{"app": "ratings"}}}
	wg.Spec.Template = &istioapi.WorkloadEntry{Labels: map[string]string{"app": "ratings", "class": "vm"}, ServiceAccount: "ratings-vm", Network: "virtual-machines"}
	pol := &authorizationv1alpha1.OnboardingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "any-ec2", Namespace: ns.Name},
		Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: []authorizationv1alpha1.AllowRule{{
			Workloads: []authorizationv1alpha1.WorkloadMatcher{{AWS: &authorizationv1alpha1.AWSMatcher{Accounts: []string{"123456789012"}, EC2: &authorizationv1alpha1.EC2Matcher{}}}},
			OnboardTo: []authorizationv1alpha1.OnboardTarget{{}},
		}}},
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "ratings-vm", Namespace: ns.Name}}
	for _, obj := range []client.Object{wg, pol, sa} {
		if err := env.Client.Create(ctx, obj); err != nil {
			b.Fatal(err)
		}
	}
	waitCached(b, wg)
	waitCached(b, pol)

	verifier, err := awsidentity.NewVerifier(audience, awsidentity.WithTrustedCertificates(map[string]*x509.Certificate{"us-east-2": ca.Certificate}))
	if err != nil {
		b.Fatal(err)
	}
	key, err := token.GenerateKey()
	if err != nil {
		b.Fatal(err)
	}
	ks, err := token.NewKeySet(key, nil)
	if err != nil {
		b.Fatal(err)
	}
	tokens, err := token.NewIssuer(token.NewStaticKeySource(ks), "https://"+audience, audience)
	if err != nil {
		b.Fatal(err)
	}
	rec := &record.FakeRecorder{}
	authz, err := policy.NewAuthorizer(cached, rec)
	if err != nil {
		b.Fatal(err)
	}
	writes := &writeCounter{}
	// Reads from the informer cache, writes to the API server: the
	// endpoint's own client (cmd/onboarding-endpoint/app).
	direct, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme, Cache: &client.CacheOptions{Reader: cached}})
	if err != nil {
		b.Fatal(err)
	}
	writing := writes.wrap(direct)
	reg, err := registry.NewRegistrar(registry.Options{Client: writing, Cache: cached, Recorder: rec, Logger: slog.New(slog.DiscardHandler),
		Writer: write.New(write.Options{QPS: 1e6, Burst: 1e6})})
	if err != nil {
		b.Fatal(err)
	}
	readCached, err := client.New(env.Config, client.Options{Scheme: env.Scheme, Cache: &client.CacheOptions{Reader: cached}})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := endpoint.NewServer(endpoint.Options{AWS: verifier, Authorizer: authz, Tokens: tokens, Registrar: reg, Client: readCached,
		Bootstrap: endpoint.BootstrapSettings{DiscoveryAddress: audience + ":15012"}, Logger: slog.New(slog.DiscardHandler),
		// Every simulated agent connects from 127.0.0.1: the per-source
		// limit of platform credential verifications would measure itself.
		VerifyLimit: endpoint.RateLimit{PerSecond: -1}})
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer()
	srv.RegisterService(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	b.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	return &stack{api: onboardingv1alpha1.NewOnboardingServiceClient(conn), writes: writes, ns: ns.Name}
}

// emptyNamespace deletes what a run made in ns and waits until the informer
// cache has seen it go, so that each run starts from a store of the same
// size, not one holding every earlier run's objects (18,000 before the raw
// runs, when they came after all onboarding runs with 1,500 each: raw at 50
// clients then measured 153 creates/s against about 290 run alone).
func emptyNamespace(b *testing.B, ctx context.Context, ns string) {
	for _, obj := range []client.Object{&runtimev1alpha1.WorkloadAutoRegistration{}, &istionetworkingv1.WorkloadEntry{}, &corev1.Secret{}} {
		if err := env.Client.DeleteAllOf(ctx, obj, client.InNamespace(ns)); err != nil {
			b.Errorf("delete the %T of namespace %s: %v", obj, ns, err)
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for _, list := range []client.ObjectList{&runtimev1alpha1.WorkloadAutoRegistrationList{}, &istionetworkingv1.WorkloadEntryList{}} {
		for {
			if err := cached.List(ctx, list, client.InNamespace(ns)); err != nil {
				b.Errorf("list %T: %v", list, err)
				break
			}
			if meta.LenList(list) == 0 {
				break
			}
			if time.Now().After(deadline) {
				b.Errorf("the informer cache still holds %d %T of namespace %s", meta.LenList(list), list, ns)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if err := env.Client.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		b.Errorf("delete namespace %s: %v", ns, err)
	}
}

func waitCached(b *testing.B, obj client.Object) {
	b.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := cached.Get(b.Context(), client.ObjectKeyFromObject(obj), obj.DeepCopyObject().(client.Object)); err == nil {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("cache never saw %s", obj.GetName())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// agent is one simulated EC2 instance's credential, signed by the demo CA.
type agent struct {
	doc, sig []byte
	ip       string
}

// workloads numbers simulated instances across the whole run, so that no two
// benchmarks' workloads share an address (which the registry would fence).
var workloads atomic.Int64

func agents(b *testing.B, n int) []agent {
	b.Helper()
	out := make([]agent, n)
	for i := range out {
		w := workloads.Add(1)
		inst := awstest.Instance{InstanceID: fmt.Sprintf("i-%017x", w), PrivateIP: fmt.Sprintf("10.%d.%d.%d", w>>16&255, w>>8&255, w&255)}
		doc := inst.Document()
		sig, err := ca.Sign(doc)
		if err != nil {
			b.Fatal(err)
		}
		out[i] = agent{doc: doc, sig: sig, ip: inst.PrivateIP}
	}
	return out
}

// run executes op for each of n items with conc workers and reports
// throughput and latency percentiles.
func run(b *testing.B, conc, n int, unit string, op func(ctx context.Context, i int) error) {
	b.Helper()
	lat := make([]time.Duration, n)
	next := atomic.Int64{}
	var wg sync.WaitGroup
	errs := make(chan error, conc)
	var done atomic.Int64
	b.ResetTimer()
	stopProfile := profileAPIServer(b, &done)
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				t0 := time.Now()
				if err := op(b.Context(), i); err != nil {
					errs <- err
					return
				}
				lat[i] = time.Since(t0)
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	stopProfile()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(n)/elapsed.Seconds(), unit+"/s")
	b.ReportMetric(float64(lat[n/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[min(n-1, n*99/100)].Microseconds())/1000, "p99-ms")
}

// profileAPIServer starts the kube-apiserver's CPU profile of this run when
// -apiserver-cpuprofile is set and b is one of the two runs it profiles;
// the returned func waits for the profile, writes it and reports
// profiled-ops: the operations completed while it ran.
func profileAPIServer(b *testing.B, done *atomic.Int64) func() {
	b.Helper()
	file := map[string]string{"BenchmarkOnboarding/agents=50": *apiProfile, "BenchmarkOnboarding/raw/clients=50": *apiProfile + ".raw"}[b.Name()]
	if *apiProfile == "" || file == "" {
		return func() {}
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		b.Fatal(err)
	}
	type profile struct {
		body []byte
		ops  int64
		err  error
	}
	ch := make(chan profile, 1)
	go func() { // reports only through ch: it may outlive a failed benchmark
		body, err := cs.RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", fmt.Sprint(*apiProfileSeconds)).DoRaw(context.Background())
		ch <- profile{body, done.Load(), err}
	}()
	return func() {
		p := <-ch
		if p.err != nil {
			b.Fatalf("kube-apiserver CPU profile: %v", p.err)
		}
		if err := os.WriteFile(file, p.body, 0o644); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(p.ops), "profiled-ops")
	}
}

// BenchmarkOnboarding runs, at each concurrency, whole onboardings
// (Onboarding/agents=N) and right after them the API server's raw creates
// (Onboarding/raw/clients=N), each from an emptied namespace: the baseline is
// measured next to the figure it is the baseline of, not after every
// onboarding run, when the API server's store and history had grown (until
// 2026-11-28 all onboarding runs came first, then all raw runs).
func BenchmarkOnboarding(b *testing.B) {
	for _, conc := range []int{1, 10, 50, 200} {
		b.Run(fmt.Sprintf("agents=%d", conc), func(b *testing.B) { onboardings(b, conc) })
		b.Run(fmt.Sprintf("raw/clients=%d", conc), func(b *testing.B) { rawCreates(b, conc) })
	}
}

// onboardings runs b.N whole onboardings with conc concurrent agents.
func onboardings(b *testing.B, conc int) {
	s := newStack(b)
	as := agents(b, b.N)
	var authorizing, registering atomic.Int64
	run(b, conc, b.N, "onboardings", func(ctx context.Context, i int) error {
		t0 := time.Now()
		defer func() { registering.Add(int64(time.Since(t0))) }()
		auth, err := s.api.Authorize(ctx, &onboardingv1alpha1.AuthorizeRequest{
			WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: s.ns, Name: "ratings"},
			Credential: &onboardingv1alpha1.AuthorizeRequest_Aws{Aws: &onboardingv1alpha1.AWSCredential{
				InstanceIdentityDocument: as[i].doc, Rsa2048Signature: string(as[i].sig)}},
		})
		if err != nil {
			return fmt.Errorf("authorize: %w", err)
		}
		authorizing.Add(int64(time.Since(t0)))
		t0 = time.Now()
		// The agent reports its version, as the real one does: the new
		// registration's status.agent is one of an onboarding's writes.
		_, err = s.api.Register(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+auth.GetToken()), &onboardingv1alpha1.RegisterRequest{
			Addresses:    []*onboardingv1alpha1.HostAddress{{Ip: as[i].ip, Type: "VPC"}},
			AgentVersion: "bench",
		})
		if err != nil {
			return fmt.Errorf("register: %w", err)
		}
		return nil
	})
	b.ReportMetric(float64(s.writes.n.Load())/float64(b.N), "writes/onboarding")
	b.ReportMetric(float64(s.writes.tokens.Load())/float64(b.N), "tokenrequests/onboarding")
	b.ReportMetric(float64(s.writes.reads.Load())/float64(b.N), "reads/onboarding")
	// Where an onboarding's time goes (mean ms per onboarding):
	// the Authorize call (verification, policy, token signing),
	// the Register call (token check, the creates, the
	// TokenRequest), and each API call inside Register.
	perOp := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(perOp(time.Duration(authorizing.Load())), "authorize-ms")
	b.ReportMetric(perOp(time.Duration(registering.Load())), "register-ms")
	s.writes.mu.Lock()
	for kind, d := range s.writes.took {
		b.ReportMetric(perOp(d), "api-"+strings.ToLower(strings.ReplaceAll(kind, ".", "-"))+"-ms")
	}
	s.writes.mu.Unlock()
}

// rawCreates is the baseline: the API server creating the same two objects
// per workload (a WorkloadAutoRegistration and a WorkloadEntry) straight
// from conc concurrent clients, with no verification, policy or token.
func rawCreates(b *testing.B, conc int) {
	s := newStack(b)
	run(b, conc, b.N, "creates", func(ctx context.Context, i int) error {
		name := fmt.Sprintf("raw-%d", i)
		war := &runtimev1alpha1.WorkloadAutoRegistration{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns},
			Spec: runtimev1alpha1.WorkloadAutoRegistrationSpec{
				Identity: runtimev1alpha1.WorkloadIdentity{AWS: &runtimev1alpha1.AWSIdentity{Partition: "aws", Account: "123456789012", Region: "us-east-2", Zone: "us-east-2b",
					EC2: &runtimev1alpha1.EC2Identity{InstanceID: fmt.Sprintf("i-%017x", i+1)}}},
				Registration:  runtimev1alpha1.Registration{Host: runtimev1alpha1.HostInfo{Addresses: []runtimev1alpha1.HostAddress{{IP: "10.0.0.1", Type: runtimev1alpha1.AddressTypeVPC}}}},
				WorkloadGroup: runtimev1alpha1.WorkloadGroupSnapshot{Name: "ratings", Spec: runtime.RawExtension{Raw: []byte(`{"template":{"serviceAccount":"ratings-vm"}}`)}},
			},
		}
		if err := env.Client.Create(ctx, war); err != nil {
			return err
		}
		we := &istionetworkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns}}
		w := workloads.Add(1)
		we.Spec.Address = fmt.Sprintf("10.%d.%d.%d", w>>16&255, w>>8&255, w&255)
		we.Spec.Network = "virtual-machines"
		return env.Client.Create(ctx, we)
	})
}
