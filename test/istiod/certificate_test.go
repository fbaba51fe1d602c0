package istiod

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	meshconfig "istio.io/api/mesh/v1alpha1"
	securityv1alpha1 "istio.io/api/security/v1alpha1"
	"k8s.io/apimachinery/pkg/util/wait"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/istioagent"
	"github.com/embark-mesh/embark/xds/upstream"
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

// The VM's real pilot-agent, without FILE_MOUNTED_CERTS and with only
// Embark's address (CA_ADDR defaults to the discovery address), gets its
// workload certificate from istiod's CA through Embark's relay, with the
// token Embark issued. (pilot-agent runs without Envoy here, so it serves no
// SDS socket: it writes the certificates it would serve over SDS as `default`
// and `ROOTCA` to OUTPUT_CERTS, which the test reads.) Once the registration
// is deleted, its token gets no certificate.
func TestSidecarCertificateFromIstiodThroughEmbark(t *testing.T) {
	ns := env.Namespace(t)
	wg := ratingsGroup(t, ns)
	ep := startEndpoint(t, ns)
	vm := register(t, wg, 11)
	roots, err := os.ReadFile(ep.rootFile)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	agent := istioagent.Start(t, istioagent.Options{
		DiscoveryAddress: ep.xds, PodName: vm.key.Name, PodNamespace: ns, InstanceIP: vm.ip, ServiceAccount: "ratings-vm",
		ProxyConfig: &meshconfig.ProxyConfig{ControlPlaneAuthPolicy: meshconfig.AuthenticationPolicy_MUTUAL_TLS},
		XDSRootCA:   roots, Token: vm.token,
		Env: map[string]string{
			"FILE_MOUNTED_CERTS": "false",
			"CA_ROOT_CA":         "./etc/xds-root-ca/root-cert.pem", // the bootstrap's root, as cluster.env names it
			"OUTPUT_CERTS":       out,
		},
	})
	chainFile := filepath.Join(out, "cert-chain.pem")
	err = wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := os.Stat(chainFile)
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("pilot-agent wrote no workload certificate: %v\npilot-agent log:\n%s", err, tail(agent.Logs()))
	}
	chainPEM, _ := os.ReadFile(chainFile)
	rootPEM, _ := os.ReadFile(filepath.Join(out, "root-cert.pem"))
	chain := parseChain(t, chainPEM)
	if len(chain) == 0 {
		t.Fatal("empty certificate chain")
	}
	leaf := chain[0]
	want := "spiffe://cluster.local/ns/" + ns + "/sa/ratings-vm"
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
	if got := parseChain(t, rootPEM); len(got) == 0 || !got[0].Equal(parseChain(t, istiod.RootCert)[0]) {
		t.Errorf("ROOTCA is not istiod's root")
	}

	// kubectl delete war: the sidecar's token gets no certificate any more.
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), vm.key, war); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(t.Context(), war); err != nil {
		t.Fatal(err)
	}
	roots2, err := upstream.NewRoots(ep.rootFile, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(ep.xds, grpc.WithTransportCredentials(credentials.NewTLS(roots2.ClientConfig("127.0.0.1"))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ca := securityv1alpha1.NewIstioCertificateServiceClient(conn)
	csr := csrPEM(t)
	err = wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+vm.token)
		_, err := ca.CreateCertificate(ctx, &securityv1alpha1.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
		c := status.Code(err)
		return c == codes.PermissionDenied || c == codes.Unauthenticated, nil
	})
	if err != nil {
		t.Errorf("a deleted registration's token still gets certificates: %v", err)
	}
}
