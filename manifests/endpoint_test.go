package manifests

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	sigsyaml "sigs.k8s.io/yaml"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/app"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	awsclient "github.com/embark-mesh/embark/onboarding/identity/aws/client"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/fixtures"
)

// workloadFixture is a workload namespace with the example policy, the
// ratings WorkloadGroup and its ServiceAccount, and a fake AWS (IMDS and
// STS on loopback: the true external edge) whose CA the endpoint trusts.
type workloadFixture struct {
	ns    string
	aws   *awstest.Env
	certs string // the endpoint's identity.aws.certificatesDir
}

func newWorkloadFixture(t *testing.T) *workloadFixture {
	t.Helper()
	f := &workloadFixture{ns: env.Namespace(t), aws: awstest.Start(t, awstest.Instance{})}
	f.certs = filepath.Join(t.TempDir(), "aws-certs")
	if err := os.MkdirAll(f.certs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.certs, "us-east-2.pem"), f.aws.CA.CertificatePEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	f.seed(t, f.ns)
	return f
}

// seed creates the fixture's policy, WorkloadGroup and ServiceAccount in
// namespace ns (the fixture's own, or one the endpoint was not given).
func (f *workloadFixture) seed(t *testing.T, ns string) {
	t.Helper()
	policyYAML, err := os.ReadFile("../api/crds/testdata/seed004/policy-any-ec2-in-accounts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	policy := &authorizationv1alpha1.OnboardingPolicy{}
	if err := sigsyaml.UnmarshalStrict(policyYAML, policy); err != nil {
		t.Fatal(err)
	}
	policy.Namespace = ns
	if err := env.Client.Create(t.Context(), policy); err != nil {
		t.Fatal(err)
	}
	fixtures.CreateGroup(t.Context(), t, env.Client, fixtures.SeedGroup(ns))
}

// endpointAddrs are one replica's loopback listeners.
// The repository listener serves only with localRepository configured.
type endpointAddrs struct{ onboarding, metrics, xds, repository string }

func newEndpointAddrs(t *testing.T) endpointAddrs {
	t.Helper()
	return endpointAddrs{onboarding: fixtures.FreeAddr(t), metrics: fixtures.FreeAddr(t), xds: fixtures.FreeAddr(t), repository: fixtures.FreeAddr(t)}
}

// writeEndpointConfig writes a configuration for an endpoint in namespace
// ns serving host: the fixture's namespace as its only workload namespace,
// loopback listeners, plaintext, denials explained to loopback callers,
// the fixture's fake AWS instead of a serving Secret and the real AWS;
// each of extra then changes it (e.g. sets an istiod). Without istiod the
// endpoint runs standalone.
func writeEndpointConfig(t *testing.T, ns, host string, f *workloadFixture, a endpointAddrs, extra ...func(*config.Configuration)) string {
	t.Helper()
	cfg := configkit.Config(ns)
	cfg.WorkloadNamespaces = []string{f.ns}
	cfg.Endpoint.Hosts = []string{host}
	// The tests read the endpoint's explanation in its denials (loopback).
	cfg.Endpoint.DetailedDenialSources = []string{"127.0.0.0/8"}
	cfg.Identity.AWS = config.AWSIdentity{CertificatesDir: f.certs, STSEndpoint: f.aws.STS.URL}
	cfg.Listen = config.Listen{Onboarding: a.onboarding, Metrics: a.metrics, XDS: a.xds, Repository: a.repository}
	for _, change := range extra {
		change(cfg)
	}
	return configkit.WriteFile(t, t.TempDir(), cfg)
}

// runEndpoint runs the real endpoint (app.Run) until ctx ends and waits for
// it to be ready; the returned channel yields Run's result.
func runEndpoint(t *testing.T, ctx context.Context, cfgFile, kubeconfig, replica string) <-chan error {
	t.Helper()
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- app.Run(ctx, app.Options{ConfigFile: cfgFile, Kubeconfig: kubeconfig, Replica: replica,
			DebugXDS: "off", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Ready: ready})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("endpoint %s did not start: %v", replica, err)
	case <-time.After(2 * time.Minute):
		t.Fatalf("endpoint %s did not start in 2m (a watch refused by RBAC keeps an informer from syncing)", replica)
	}
	return done
}

// session is what a registered agent holds: its onboarding token and the
// session key Unregister needs.
type session struct{ token, key string }

// onboard authorizes the fixture's instance and registers it at addr from
// ip; it returns the registration's name and the agent's session.
func onboard(t *testing.T, ctx context.Context, addr, host string, f *workloadFixture, ip string) (string, session) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := onboardingv1alpha1.NewOnboardingServiceClient(conn)
	// A call the endpoint cannot finish (an informer RBAC keeps from
	// syncing blocks it) fails the test instead of hanging it.
	callCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	auth, err := authorize(t, callCtx, api, host, f, f.ns)
	if err != nil {
		t.Fatalf("Authorize: %v", err)
	}
	reg, err := api.Register(metadata.AppendToOutgoingContext(callCtx, "authorization", "Bearer "+auth.GetToken()), &onboardingv1alpha1.RegisterRequest{
		Addresses: []*onboardingv1alpha1.HostAddress{{Ip: ip, Type: "VPC"}},
	})
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	return reg.GetRegistrationName(), session{token: auth.GetToken(), key: reg.GetSessionKey()}
}

// authorize asks api to authorize the fixture's instance (its credential
// for host) for the ratings WorkloadGroup of namespace ns.
func authorize(t *testing.T, ctx context.Context, api onboardingv1alpha1.OnboardingServiceClient, host string, f *workloadFixture, ns string) (*onboardingv1alpha1.AuthorizeResponse, error) {
	t.Helper()
	cred, err := awsclient.Credential(ctx, imds.New(imds.Options{Endpoint: f.aws.IMDS.URL}), nil, host)
	if err != nil {
		t.Fatal(err)
	}
	return api.Authorize(ctx, &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: ns, Name: "ratings"},
		Credential: &onboardingv1alpha1.AuthorizeRequest_Aws{Aws: &onboardingv1alpha1.AWSCredential{
			InstanceIdentityDocument: cred.Document, Rsa2048Signature: string(cred.Signature),
		}},
	})
}

// unregister unregisters the workload of session s at addr.
func unregister(t *testing.T, ctx context.Context, addr string, s session) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = onboardingv1alpha1.NewOnboardingServiceClient(conn).Unregister(
		metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+s.token, "embark-session-key", s.key), &onboardingv1alpha1.UnregisterRequest{})
	return err
}
