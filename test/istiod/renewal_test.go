package istiod

import (
	"context"
	"crypto/x509"
	"os"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry/boundtoken"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/meshkit"
)

// shortTTL is the workload certificate lifetime pilot-agent asks for here
// (SECRET_TTL): it renews at half of it, so several times in one test.
const shortTTL = 30 * time.Second

// The VM's real pilot-agent asks for certificates of a short lifetime and
// renews them through Embark's CA relay many times while its ADS stream to
// Embark stays open: every renewal is served over SDS as a new `default`
// (another serial, signed by istiod's CA) before the one it replaces
// expires, and the registration's AgentConnected condition and connection
// record do not change.
func TestCertificateRenewalAtShortTTL(t *testing.T) {
	ns := env.Namespace(t)
	wg := ratingsGroup(t, ns)
	ep := startEndpoint(t, ns)
	vm := register(t, wg, 13)
	agent := meshkit.StartSidecar(t, ep.xds, ep.rootFile, vm.VM, istioagent.Options{
		EnvoyStandIn: true,
		Env:          map[string]string{"SECRET_TTL": shortTTL.String()},
	})
	node, err := agent.Node()
	if err != nil {
		t.Fatal(err)
	}
	// The sidecar's ADS stream to Embark, through pilot-agent's xDS proxy.
	ads, resp := meshkit.Listeners(t, t.Context(), agent)
	before := waitAgentConnected(t, vm)

	next := sdsWatch(t, agent, node, "default")
	prev := leafOf(t, next())
	const renewals = 3
	for i := range renewals {
		cur := leafOf(t, next())
		got := time.Now()
		if cur.SerialNumber.Cmp(prev.SerialNumber) == 0 {
			t.Fatalf("renewal %d: SDS pushed the same certificate (serial %s)", i+1, cur.SerialNumber)
		}
		if !got.Before(prev.NotAfter) {
			t.Errorf("renewal %d: served at %s, after the previous certificate expired (%s)", i+1, got.Format(time.RFC3339), prev.NotAfter.Format(time.RFC3339))
		}
		if life := cur.NotAfter.Sub(cur.NotBefore); life > shortTTL+2*time.Minute {
			t.Errorf("renewal %d: certificate valid for %s, want about SECRET_TTL %s", i+1, life, shortTTL)
		}
		if _, err := cur.Verify(x509.VerifyOptions{Roots: istiod.RootPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			t.Errorf("renewal %d: certificate does not chain to istiod's root: %v", i+1, err)
		}
		t.Logf("renewal %d: serial %s valid %s to %s, served %s before the previous one expired", i+1, cur.SerialNumber, cur.NotBefore.Format(time.TimeOnly), cur.NotAfter.Format(time.TimeOnly), prev.NotAfter.Sub(got).Round(time.Second))
		prev = cur
	}
	// Every certificate went through Embark's CA relay, none refused.
	fams := meshkit.Scrape(t, ep.metrics)
	if ok := metricSum(fams, "embark_ca_requests_total", map[string]string{"code": "OK"}); ok < renewals+1 {
		t.Errorf("embark_ca_requests_total{code=OK} = %v, want at least %d (the first certificate and %d renewals)", ok, renewals+1, renewals)
	}
	if all, ok := metricSum(fams, "embark_ca_requests_total", nil), metricSum(fams, "embark_ca_requests_total", map[string]string{"code": "OK"}); all != ok {
		t.Errorf("embark_ca_requests_total: %v requests, %v OK: a renewal failed", all, ok)
	}

	after := waitAgentConnected(t, vm)
	if !after.cond.LastTransitionTime.Equal(&before.cond.LastTransitionTime) || after.cond.Reason != before.cond.Reason {
		t.Errorf("AgentConnected changed during the renewals: %+v, then %+v", before.cond, after.cond)
	}
	if !after.connectedAt.Equal(before.connectedAt) || after.disconnected {
		t.Errorf("the ADS stream to Embark was re-established during the renewals: connected at %v, then %v (disconnected: %v)", before.connectedAt, after.connectedAt, after.disconnected)
	}
	// The ADS stream still answers.
	if err := ads.Send(resource.ListenerType, nil, resp.GetVersionInfo(), resp.GetNonce()); err != nil {
		t.Errorf("the ADS stream after the renewals: %v", err)
	}
}

// connection is what the registration records of the workload's connection.
type connection struct {
	cond         metav1.Condition
	connectedAt  *metav1.Time
	disconnected bool
}

// waitAgentConnected waits for the registration of vm to be AgentConnected
// and returns what it records.
func waitAgentConnected(t *testing.T, vm *workload) connection {
	t.Helper()
	var c connection
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		war := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := env.Client.Get(ctx, vm.Key, war); err != nil {
			return false, nil
		}
		cond := meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected)
		if cond == nil || cond.Status != metav1.ConditionTrue || war.Status.Connection == nil {
			return false, nil
		}
		c = connection{cond: *cond, connectedAt: war.Status.Connection.ConnectedAt, disconnected: war.Status.Connection.DisconnectedAt != nil}
		return true, nil
	})
	if err != nil {
		t.Fatalf("registration %s never AgentConnected: %v", vm.Key, err)
	}
	return c
}

// sdsWatch opens an SDS stream for name on pilot-agent's socket, as Envoy
// does, and returns a function that waits for the next push of the secret
// (at most two certificate lifetimes) and ACKs it.
func sdsWatch(t *testing.T, agent *istioagent.Agent, node *core.Node, name string) func() *tlsv3.Secret {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+agent.SDSSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	var st secretv3.SecretDiscoveryService_StreamSecretsClient
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		if _, err := os.Stat(agent.SDSSocket()); err != nil {
			return false, nil
		}
		st, err = secretv3.NewSecretDiscoveryServiceClient(conn).StreamSecrets(t.Context())
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("no SDS socket at %s: %v\npilot-agent log:\n%s", agent.SDSSocket(), err, meshkit.Tail(agent.Logs()))
	}
	if err := st.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.SecretType, ResourceNames: []string{name}}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		resp *discovery.DiscoveryResponse
		err  error
	}
	return func() *tlsv3.Secret {
		t.Helper()
		for {
			ch := make(chan result, 1)
			go func() { r, err := st.Recv(); ch <- result{r, err} }()
			var r result
			select {
			case r = <-ch:
			case <-time.After(2 * shortTTL):
				t.Fatalf("SDS %s: no push within %s\npilot-agent log:\n%s", name, 2*shortTTL, meshkit.Tail(agent.Logs()))
			}
			if r.err != nil {
				t.Fatalf("SDS %s: %v\npilot-agent log:\n%s", name, r.err, meshkit.Tail(agent.Logs()))
			}
			_ = st.Send(&discovery.DiscoveryRequest{TypeUrl: resource.SecretType, ResourceNames: []string{name}, VersionInfo: r.resp.GetVersionInfo(), ResponseNonce: r.resp.GetNonce()})
			for _, a := range r.resp.GetResources() {
				s := &tlsv3.Secret{}
				if err := a.UnmarshalTo(s); err != nil {
					t.Fatal(err)
				}
				if s.GetName() == name {
					return s
				}
			}
		}
	}
}

// leafOf is the workload certificate of an SDS `default` secret.
func leafOf(t *testing.T, s *tlsv3.Secret) *x509.Certificate {
	t.Helper()
	chain := parseChain(t, s.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
	if len(chain) == 0 {
		t.Fatal("SDS default: empty certificate chain")
	}
	return chain[0]
}

// A certificate request for 90 days, through Embark's relay to the real
// istiod, gets a certificate that expires no later than the sidecar token
// that asked for it: deleting the registration revokes it within the
// token's lifetime.
func TestCertificateValidityCappedAtTheToken(t *testing.T) {
	ns := env.Namespace(t)
	wg := ratingsGroup(t, ns)
	ep := startEndpoint(t, ns)
	vm := register(t, wg, 14)
	claims, err := boundtoken.Decode(vm.Token)
	if err != nil {
		t.Fatal(err)
	}
	exp, ok := claims.ExpiresAt()
	if !ok {
		t.Fatal("the sidecar token has no exp")
	}
	conn := meshkit.Dial(t, ep.xds, ep.rootFile)
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+vm.Token)
	resp, err := securityv1alpha1.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx,
		&securityv1alpha1.IstioCertificateRequest{Csr: csrPEM(t), ValidityDuration: 90 * 24 * 3600})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetCertChain()) == 0 {
		t.Fatal("no certificate")
	}
	leaf := parseChain(t, []byte(resp.GetCertChain()[0]))[0]
	if leaf.NotAfter.After(exp.Add(time.Second)) {
		t.Errorf("certificate valid until %s, after its sidecar token expires (%s)", leaf.NotAfter.Format(time.RFC3339), exp.Format(time.RFC3339))
	}
	if leaf.NotAfter.Before(exp.Add(-time.Minute)) {
		t.Errorf("certificate valid until %s, well before its sidecar token expires (%s): the ask was cut more than the cap", leaf.NotAfter.Format(time.RFC3339), exp.Format(time.RFC3339))
	}
}
