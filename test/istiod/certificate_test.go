package istiod

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	"k8s.io/apimachinery/pkg/util/wait"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/test/meshkit"
)

func parseChain(t *testing.T, data []byte) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return out
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
}

// The VM's real pilot-agent, with only Embark's address (CA_ADDR defaults
// to the discovery address), gets its workload certificate from istiod's CA
// through Embark's relay, with the token Embark issued, and serves it to
// Envoy over SDS: a gRPC SDS client (go-control-plane's secret service v3,
// what Envoy speaks) on pilot-agent's SDS socket receives `default` and
// `ROOTCA`, one stream each as Envoy opens them. pilot-agent serves no SDS
// socket without Envoy (pkg/istio-agent/agent.go, initSdsServer: with
// DisableEnvoy it only fetches and rotates the certificates, and starts no
// SDS server), so it runs here with Envoy enabled and a stand-in for Envoy's
// binary (istioagent.Options.EnvoyStandIn; there is no Envoy binary here).
// Once the registration is deleted, its token gets no certificate.
func TestSidecarCertificateFromIstiodThroughEmbark(t *testing.T) {
	ns := env.Namespace(t)
	wg := ratingsGroup(t, ns)
	ep := startEndpoint(t, ns)
	vm := register(t, wg, 11)
	agent := meshkit.StartSidecar(t, ep.xds, ep.rootFile, vm.VM, istioagent.Options{
		EnvoyStandIn: true,
	})
	node, err := agent.Node()
	if err != nil {
		t.Fatal(err)
	}
	defaultSecret := sdsSecret(t, agent, node, "default")
	rootSecret := sdsSecret(t, agent, node, "ROOTCA")

	chain := parseChain(t, defaultSecret.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
	if len(chain) == 0 {
		t.Fatal("SDS default: empty certificate chain")
	}
	if len(defaultSecret.GetTlsCertificate().GetPrivateKey().GetInlineBytes()) == 0 {
		t.Error("SDS default: no private key")
	}
	leaf := chain[0]
	want := "spiffe://cluster.local/ns/" + ns + "/sa/" + fixtures.ServiceAccount
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != want {
		t.Errorf("workload certificate URI SANs %v, want %s", leaf.URIs, want)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: istiod.RootPool(), Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("workload certificate does not chain to istiod's root: %v", err)
	}
	if got := parseChain(t, rootSecret.GetValidationContext().GetTrustedCa().GetInlineBytes()); len(got) == 0 || !got[0].Equal(parseChain(t, istiod.RootCert)[0]) {
		t.Errorf("SDS ROOTCA is not istiod's root")
	}

	// kubectl delete war: the sidecar's token gets no certificate any more.
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), vm.Key, war); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(t.Context(), war); err != nil {
		t.Fatal(err)
	}
	conn := meshkit.Dial(t, ep.xds, ep.rootFile)
	defer conn.Close()
	ca := securityv1alpha1.NewIstioCertificateServiceClient(conn)
	csr := csrPEM(t)
	err = wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+vm.Token)
		_, err := ca.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
		c := status.Code(err)
		return c == codes.PermissionDenied || c == codes.Unauthenticated, nil
	})
	if err != nil {
		t.Errorf("a deleted registration's token still gets certificates: %v", err)
	}
}

// sdsSecret asks pilot-agent's SDS socket for the secret name as Envoy does
// (a stream of its own, the node first) and returns the first one served.
func sdsSecret(t *testing.T, agent *istioagent.Agent, node *core.Node, name string) *tlsv3.Secret {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	st := meshkit.OpenSDS(t, ctx, agent, node, name)
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("SDS %s: %v\npilot-agent log:\n%s", name, err, meshkit.Tail(agent.Logs()))
	}
	for _, r := range resp.GetResources() {
		s := &tlsv3.Secret{}
		if err := r.UnmarshalTo(s); err != nil {
			t.Fatal(err)
		}
		if s.GetName() == name {
			_ = st.Send(&discovery.DiscoveryRequest{TypeUrl: resource.SecretType, ResourceNames: []string{name}, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
			return s
		}
	}
	t.Fatalf("SDS %s: response without it (%d resources)", name, len(resp.GetResources()))
	return nil
}
