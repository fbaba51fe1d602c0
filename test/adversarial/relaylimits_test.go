package adversarial

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/limits"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/testenv"
	"github.com/embark-mesh/embark/xds/ca"
	"github.com/embark-mesh/embark/xds/relay"
	"github.com/embark-mesh/embark/xds/upstream"
)

// istiodConn runs a real istiod until the test ends and dials its secure
// port as the endpoint does (its root, its server name).
func istiodConn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	i, err := testenv.StartIstiod(t.Context(), env, testenv.IstiodOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = i.Close() })
	roots := filepath.Join(t.TempDir(), "root-cert.pem")
	if err := os.WriteFile(roots, i.RootCert, 0o600); err != nil {
		t.Fatal(err)
	}
	conn, err := upstream.Dial(t.Context(), upstream.Options{Address: i.SecureGRPCAddr, ServerName: testenv.IstiodServerName, RootCertFile: roots})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// csrFor is a certificate request for the SPIFFE identity of service
// account sa in ns, as pilot-agent makes it.
func csrFor(t *testing.T, ns, sa string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := url.Parse("spiffe://cluster.local/ns/" + ns + "/sa/" + sa)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{id}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

// A genuine registered sidecar asks Embark's CA relay for a 90-day
// certificate. Before the cap, istiod issued it (its own maximum is 90
// days): deleting the registration voided the token but left the VM a mesh
// identity for 90 days. The leaf istiod issues must end no later than the
// token (and never more than 24h from now).
func TestLongCertificateOutlivesTheRegistration(t *testing.T) {
	Attack(t, "CA relay: a registered sidecar asks for a 90-day certificate, which outlives its registration")
	ns := env.Namespace(t)
	p := startXDS(t, limits.Options{})
	vm := registerWorkload(t, p, ns, "ratings", "i-00000000000000c41", "10.1.0.41")
	r, err := ca.New(ca.Options{Upstream: istiodConn(t), Authorizer: p.server})
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	r.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })

	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+vm.token)
	asked := time.Now()
	resp, err := securityv1alpha1.NewIstioCertificateServiceClient(conn).CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{
		Csr: csrFor(t, ns, fixtures.ServiceAccount), ValidityDuration: int64(90 * 24 * time.Hour / time.Second),
	})
	if err != nil {
		t.Fatalf("a registered sidecar's certificate request: %v (the relay must cap the validity, not refuse)", err)
	}
	b, _ := pem.Decode([]byte(resp.GetCertChain()[0]))
	if b == nil {
		t.Fatalf("leaf is not PEM: %q", resp.GetCertChain()[0])
	}
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if want := "spiffe://cluster.local/ns/" + ns + "/sa/" + fixtures.ServiceAccount; len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
		t.Fatalf("leaf URI SANs %v, want %s (the attack did not run)", leaf.URIs, want)
	}
	// A minute of slack for the seconds rounding and the clocks.
	bound := asked.Add(ca.DefaultMaxValidity)
	if vm.expires.Before(bound) {
		bound = vm.expires
	}
	bound = bound.Add(time.Minute)
	t.Logf("token expires %s; leaf valid %s .. %s", vm.expires.UTC(), leaf.NotBefore.UTC(), leaf.NotAfter.UTC())
	if leaf.NotAfter.After(bound) {
		t.Errorf("the leaf certificate is valid until %s, %s after its sidecar token expires (%s): deleting the registration does not end the VM's mesh identity",
			leaf.NotAfter.UTC(), leaf.NotAfter.Sub(vm.expires).Round(time.Minute), vm.expires.UTC())
	}
}

// attackNames is the subscription of the attack: 480,000 EDS cluster names
// (about 26 MB), sent in messages under the default 4 MiB message limit.
const attackNames = 480_000

// subscribeHalfAMillion sends attackNames names on s in messages of
// 60,000 (about 3.2 MB), checking held (what the server holds) after
// each, and returns the stream's end. held must never be over limit.
func subscribeHalfAMillion(t *testing.T, s discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient, vm *sidecar, held func() int64, limit int64) error {
	t.Helper()
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := s.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	const perMessage = 60_000
	most := int64(0)
	for i := 0; i < attackNames; i += perMessage {
		names := make([]string, perMessage)
		for j := range names {
			names[j] = fmt.Sprintf("outbound|9080||svc-%06d.attack.svc.cluster.local", i+j)
		}
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: names}
		if i == 0 {
			req.Node = nodeOf(vm.nodeID)
		}
		if err := s.Send(req); err != nil {
			break // the server ended the stream: its status is what Recv gets
		}
		time.Sleep(100 * time.Millisecond) // let the server take it in
		most = max(most, held())
	}
	var err error
	select {
	case err = <-ended:
	case <-time.After(30 * time.Second):
		err = fmt.Errorf("the stream was still open 30s after %d names were subscribed to", attackNames)
	}
	most = max(most, held())
	if most > limit {
		t.Errorf("the server held %d subscribed names of one stream, over the limit of %d", most, limit)
	}
	return err
}

// One authenticated Delta stream subscribes to 480,000 resource names. In
// istiod mode the relay kept every one (+62 MiB for one stream) and
// forwarded them to istiod; the stream must be refused RESOURCE_EXHAUSTED
// naming the type and the limit, and the relay hold none of them after.
func TestHalfAMillionSubscribedNames(t *testing.T) {
	tests := []struct {
		mode   string
		attack string
		relay  bool
	}{
		{mode: "istiod", relay: true, attack: "xDS relay: one authenticated Delta stream subscribes to 480,000 resource names, all held and forwarded to istiod"},
		{mode: "standalone", attack: "xDS standalone: one authenticated Delta stream subscribes to 480,000 resource names, all held by the server"},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			Attack(t, tt.attack)
			var r *relay.Relay
			if tt.relay {
				var err error
				if r, err = relay.New(relay.Options{Conn: istiodConn(t)}); err != nil {
					t.Fatal(err)
				}
			}
			p := startXDSWith(t, limits.Options{}, r)
			ns := env.Namespace(t)
			vm := registerWorkload(t, p, ns, "ratings", "i-00000000000000c51", "10.1.0.51")
			ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+vm.token)
			s, err := discovery.NewAggregatedDiscoveryServiceClient(dialFrom(t, "127.0.0.1", p.addr)).DeltaAggregatedResources(ctx)
			if err != nil {
				t.Fatal(err)
			}
			held := func() int64 { return p.server.State().SubscribedNames }
			err = subscribeHalfAMillion(t, s, vm, held, limits.DefaultMaxSubscribedNamesPerType)
			if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), resource.EndpointType) || !strings.Contains(err.Error(), "names per type") {
				t.Fatalf("the stream ended with %v, want ResourceExhausted naming %s and the limit", err, resource.EndpointType)
			}
			waitUntil(t, "the server to hold none of the stream's names", func() bool { return held() == 0 })
		})
	}
}
