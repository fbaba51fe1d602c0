package manifests

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/ProtonMail/go-crypto/openpgp/packet"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/prometheus/promql"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/test/adsclient"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/testenv"
)

// scrapeStep is the TSDB clock's interval between two scrapes of a run,
// Prometheus' usual 30 s; the run itself takes as long as its steps do.
const scrapeStep = 30 * time.Second

// run is a real run's scrapes in a TSDB: the replicas' /metrics read
// after each step of a scenario, scrapeStep apart on the TSDB's clock
// (which starts an hour ago, so that every sample is in the past).
type run struct {
	mode       string
	p          *promDB
	targets    []scrapeTarget
	start, end time.Time
	n          int
}

func newRun(t *testing.T, mode string, targets []scrapeTarget) *run {
	t.Helper()
	start := time.Now().Add(-time.Hour).Truncate(time.Minute)
	return &run{mode: mode, p: newPromDB(t), targets: targets, start: start, end: start}
}

// scrape scrapes every target k times at the next k steps of the clock.
func (r *run) scrape(t *testing.T, k int) {
	t.Helper()
	for range k {
		ts := r.start.Add(time.Duration(r.n) * scrapeStep)
		app := r.p.db.Appender(t.Context())
		for _, tg := range r.targets {
			scrape(t, app, tg, ts)
		}
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
		r.end, r.n = ts, r.n+1
	}
}

// rangeQuery evaluates expr over the whole run at each step.
func (r *run) rangeQuery(t *testing.T, expr string) promql.Matrix {
	t.Helper()
	q, err := r.p.engine.NewRangeQuery(t.Context(), r.p.db, nil, expr, r.start, r.end, scrapeStep)
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	defer q.Close()
	res := q.Exec(t.Context())
	if res.Err != nil {
		t.Fatalf("%s: %v", expr, res.Err)
	}
	m, err := res.Matrix()
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return m
}

// vm is a workload onboarded through a replica's onboarding API, as the
// agent does, with its sidecar's bootstrap.
type vm struct {
	bootstrap *onboardingv1alpha1.SidecarBootstrap
	reg       types.NamespacedName
}

// onboardVM authorizes and registers the fixture's instance at addr from
// ip, as the agent does.
func onboardVM(t *testing.T, ctx context.Context, addr, host string, f *workloadFixture, ip string) *vm {
	t.Helper()
	conn := dialPlain(t, addr)
	api := onboardingv1alpha1.NewOnboardingServiceClient(conn)
	auth, err := authorize(t, ctx, api, host, f, f.ns)
	if err != nil {
		t.Fatalf("Authorize: %v", err)
	}
	res, err := api.Register(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+auth.GetToken()), &onboardingv1alpha1.RegisterRequest{
		Addresses: []*onboardingv1alpha1.HostAddress{{Ip: ip, Type: "VPC"}}, AgentVersion: "v0.0.0-test",
	})
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	return &vm{bootstrap: res.GetBootstrap(), reg: types.NamespacedName{Namespace: res.GetNamespace(), Name: res.GetRegistrationName()}}
}

// deny asks addr to authorize the fixture's instance for a WorkloadGroup
// of a namespace no policy lets it join; the endpoint denies it.
func deny(t *testing.T, ctx context.Context, addr, host string, f *workloadFixture) {
	t.Helper()
	if _, err := authorize(t, ctx, onboardingv1alpha1.NewOnboardingServiceClient(dialPlain(t, addr)), host, f, "embark-nowhere"); err == nil {
		t.Fatal("Authorize for a namespace without a policy succeeded")
	}
}

func dialPlain(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// sidecarStream is a sidecar's ADS stream, as pilot-agent opens it.
type sidecarStream struct {
	st     *adsclient.SotW
	first  *discovery.DiscoveryResponse
	cancel func()
}

// openStream opens an ADS stream to xdsAddr with token as node id and
// asks for listeners; it returns the stream, or the error of its first
// response.
func openStream(t *testing.T, xdsAddr, token, id string) (*sidecarStream, error) {
	t.Helper()
	node := &core.Node{Id: id, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"PROXY_CONFIG": structpb.NewStructValue(&structpb.Struct{}),
	}}}
	st, err := adsclient.OpenSotW(context.WithoutCancel(t.Context()), dialPlain(t, xdsAddr), token, node)
	if err != nil {
		return nil, err
	}
	t.Cleanup(st.Close)
	if err := st.Request(resource.ListenerType); err != nil {
		return nil, err
	}
	first, err := st.Next()
	if err != nil {
		return nil, err
	}
	go func() { _ = st.Wait() }() // drain pushes
	return &sidecarStream{st: st, first: first, cancel: st.Close}, nil
}

// send sends req on the stream.
func (s *sidecarStream) send(t *testing.T, req *discovery.DiscoveryRequest) {
	t.Helper()
	if err := s.st.Send(req); err != nil {
		t.Fatal(err)
	}
}

// healthType is the type URL of pilot-agent's health reports.
const healthType = "type.googleapis.com/istio.v1.HealthInformation"

// sidecarLife is what a sidecar does in both modes, between scrapes: a
// stream with a bad token refused, the VM's stream opened and reported
// healthy, its first listener push NACKed, its WorkloadGroup changed under
// it (to version), and the stream closed (the registration removed after
// the grace period).
func sidecarLife(t *testing.T, ctx context.Context, r *run, xdsAddr string, v *vm, f *workloadFixture, version string) {
	t.Helper()
	if _, err := openStream(t, xdsAddr, "not-a-token", v.bootstrap.GetNodeId()); err == nil {
		t.Error("a stream with a bad token was not refused")
	}
	s, err := openStream(t, xdsAddr, v.bootstrap.GetSidecarToken(), v.bootstrap.GetNodeId())
	if err != nil {
		t.Fatalf("the VM's stream: %v", err)
	}
	waitConnected(t, ctx, v)
	r.waitGrows(t, ctx, "the VM's health report", "embark_registry_health_writes_total", func() {
		s.send(t, &discovery.DiscoveryRequest{TypeUrl: healthType})
	})
	s.send(t, &discovery.DiscoveryRequest{TypeUrl: resource.ListenerType, ResponseNonce: s.first.GetNonce(),
		ErrorDetail: &rpcstatus.Status{Code: 3, Message: "listener rejected"}})
	r.scrape(t, 3)

	r.waitGrows(t, ctx, "the group's change", "embark_registry_workloadgroup_out_of_date_writes_total", func() {
		wg := &istionetworkingv1.WorkloadGroup{}
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: f.ns, Name: "ratings"}, wg); err != nil {
			t.Fatal(err)
		}
		wg.Spec.Template.Labels["version"] = version
		if err := env.Client.Update(ctx, wg); err != nil {
			t.Fatal(err)
		}
	})
	r.scrape(t, 3)

	r.waitGrows(t, ctx, "the removal after the grace period", "embark_registry_grace_period_removals_total", s.cancel)
	collectGarbage(t, ctx, v)
	r.scrape(t, 4)
}

// collectGarbage deletes the WorkloadEntries and Secrets the removed
// registration of v owned, as the API server's garbage collector (which
// this test environment does not run) does, so that the VM can onboard
// again.
func collectGarbage(t *testing.T, ctx context.Context, v *vm) {
	t.Helper()
	var entries istionetworkingv1.WorkloadEntryList
	var secrets corev1.SecretList
	var owned []client.Object
	for _, list := range []client.ObjectList{&entries, &secrets} {
		if err := env.Client.List(ctx, list, client.InNamespace(v.reg.Namespace)); err != nil {
			t.Fatal(err)
		}
	}
	for _, we := range entries.Items {
		owned = append(owned, we)
	}
	for i := range secrets.Items {
		owned = append(owned, &secrets.Items[i])
	}
	for _, o := range owned {
		for _, ref := range o.GetOwnerReferences() {
			if ref.Name == v.reg.Name {
				if err := env.Client.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
					t.Fatal(err)
				}
			}
		}
	}
}

// waitGrows does act and waits until the sum of name over the run's
// targets grows.
func (r *run) waitGrows(t *testing.T, ctx context.Context, what, name string, act func()) {
	t.Helper()
	sum := func() float64 {
		total := 0.0
		for _, tg := range r.targets {
			total += metricValue(t, tg.addr, name)
		}
		return total
	}
	before := sum()
	act()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return sum() > before, nil
	}); err != nil {
		t.Fatalf("%s: %s stays at %v", what, name, before)
	}
}

// lives is how many times a run's VM goes through its life: twice, so
// that each labelled counter, whose series starts at its first event
// (which rate and increase do not count), rises at the second.
const lives = 2

// gracePeriod sets the runs' registration grace period: short, so that the
// closed stream's registration is removed within the run.
func gracePeriod(cfg *config.Configuration) {
	cfg.Registration.GracePeriod = configkit.Duration(time.Second)
}

// localRepository sets a localRepository: an empty directory and a
// signing key that expires in 90 days, so that the run reports a key's
// expiry as a real installation does.
func localRepository(t *testing.T) func(*config.Configuration) {
	t.Helper()
	dir := t.TempDir()
	e, err := openpgp.NewEntity("repository", "test", "repository@example.invalid", &packet.Config{
		Algorithm: packet.PubKeyAlgoEdDSA, KeyLifetimeSecs: uint32(90 * 24 * time.Hour / time.Second),
	})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w, err := armor.Encode(&buf, openpgp.PrivateKeyType, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SerializePrivate(w, nil); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "signing-key.asc")
	if err := os.WriteFile(key, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	repo := filepath.Join(dir, "repository")
	if err := os.Mkdir(repo, 0o755); err != nil {
		t.Fatal(err)
	}
	return func(cfg *config.Configuration) {
		cfg.LocalRepository = &config.LocalRepository{Directory: repo, SigningKeyFile: key}
	}
}

// waitConnected waits until the VM's registration records its connection,
// as the status the health report's time to first healthy counts from.
func waitConnected(t *testing.T, ctx context.Context, v *vm) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		reg := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := env.Client.Get(ctx, v.reg, reg); err != nil {
			return false, err
		}
		c := reg.Status.Connection
		return c != nil && c.ConnectedAt != nil, nil
	}); err != nil {
		t.Fatalf("the registration %s does not record the connection: %v", v.reg, err)
	}
}

// awaitStop waits, when the test ends (its context cancelled, which stops
// the endpoints), for the endpoints' Run to return without an error.
func awaitStop(t *testing.T, dones ...<-chan error) {
	t.Cleanup(func() {
		for _, done := range dones {
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("endpoint returned %v after shutdown", err)
				}
			case <-time.After(time.Minute):
				t.Error("an endpoint did not stop")
			}
		}
	})
}

// standaloneRun is a real standalone run: two replicas (Embark serves the
// xDS configuration), a VM onboarded, a denial, and the sidecar's life.
func standaloneRun(t *testing.T, ctx context.Context) *run {
	t.Helper()
	rs := startReplicas(t, ctx, gracePeriod, localRepository(t))
	awaitStop(t, rs.dones...)
	r := newRun(t, "standalone", rs.targets)
	r.scrape(t, 4)
	for life := range lives {
		v := onboardVM(t, ctx, rs.addrs[0].onboarding, rs.host, rs.fixture, "172.31.5.254")
		deny(t, ctx, rs.addrs[0].onboarding, rs.host, rs.fixture)
		r.scrape(t, 2)
		sidecarLife(t, ctx, r, rs.addrs[0].xds, v, rs.fixture, fmt.Sprintf("v%d", life+2))
	}
	return r
}

// istiodRun is a real istiod-mode run: one replica relaying to a real
// istiod, a VM onboarded, a denial, the sidecar's life through the relay,
// and certificate requests relayed, refused and failed at istiod.
func istiodRun(t *testing.T, ctx context.Context) *run {
	t.Helper()
	_, ir := startIstiodReplica(t, ctx)
	r := newRun(t, "istiod", ir.targets)
	r.scrape(t, 4)
	a, host, f := ir.addrs, ir.host, ir.fixture
	ask := func(token, csr string) error { return ir.ask(ctx, token, csr) }
	for life := range lives {
		v := onboardVM(t, ctx, a.onboarding, host, f, "172.31.5.254")
		deny(t, ctx, a.onboarding, host, f)
		r.scrape(t, 2)
		if err := ask(v.bootstrap.GetSidecarToken(), csrPEM(t)); err != nil {
			t.Fatalf("certificate through Embark: %v", err)
		}
		if err := ask("not-a-token", csrPEM(t)); err == nil {
			t.Error("a certificate request with a bad token was relayed")
		}
		if err := ask(v.bootstrap.GetSidecarToken(), "-----BEGIN CERTIFICATE REQUEST-----\nbm90IGEgQ1NS\n-----END CERTIFICATE REQUEST-----\n"); err == nil {
			t.Error("istiod signed a request that is no CSR")
		}
		r.scrape(t, 3)
		sidecarLife(t, ctx, r, a.xds, v, f, fmt.Sprintf("v%d", life+2))
	}
	return r
}

// istiodReplica is one replica in istiod mode, relaying to a real istiod.
type istiodReplica struct {
	addrs   endpointAddrs
	host    string
	fixture *workloadFixture
	targets []scrapeTarget
	ca      securityv1alpha1.IstioCertificateServiceClient
}

// ask asks the replica's certificate API for csr with token.
func (ir *istiodReplica) ask(ctx context.Context, token, csr string) error {
	return ir.askWithin(ctx, 30*time.Second, token, csr)
}

// askWithin is ask with the caller's deadline d, as pilot-agent sets one.
func (ir *istiodReplica) askWithin(ctx context.Context, d time.Duration, token, csr string) error {
	callCtx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token), d)
	defer cancel()
	_, err := ir.ca.CreateCertificate(callCtx, &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
	return err
}

// startIstiodReplica starts a real istiod and one replica relaying to it.
func startIstiodReplica(t *testing.T, ctx context.Context) (*testenv.Istiod, *istiodReplica) {
	t.Helper()
	i, err := testenv.StartIstiod(ctx, env, testenv.IstiodOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = i.Close() })
	roots := filepath.Join(t.TempDir(), "istiod-root-cert.pem")
	if err := os.WriteFile(roots, i.RootCert, 0o600); err != nil {
		t.Fatal(err)
	}
	istiodCfg := func(cfg *config.Configuration) {
		cfg.Istiod = config.Istiod{Address: i.SecureGRPCAddr, ServerName: testenv.IstiodServerName, RootCertFile: roots}
	}
	ir := &istiodReplica{fixture: newWorkloadFixture(t), host: "onboarding-endpoint.example.corp", addrs: newEndpointAddrs(t)}
	awaitStop(t, runEndpoint(t, ctx, writeEndpointConfig(t, env.Namespace(t), ir.host, ir.fixture, ir.addrs, istiodCfg, gracePeriod), env.KubeconfigPath, "onboarding-endpoint-istiod"))
	ir.targets = []scrapeTarget{{pod: "onboarding-endpoint-istiod", addr: ir.addrs.metrics}}
	ir.ca = securityv1alpha1.NewIstioCertificateServiceClient(dialPlain(t, ir.addrs.xds))
	return i, ir
}

// csrPEM is a PEM certificate request with a fresh key.
func csrPEM(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "vm"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}
