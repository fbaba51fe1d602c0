package app

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	awsclient "github.com/embark-mesh/embark/onboarding/identity/aws/client"
	"github.com/embark-mesh/embark/registry/replica"
	"github.com/embark-mesh/embark/test/endpointkit/configkit"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/freeport"
	"github.com/embark-mesh/embark/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{GarbageCollector: true}, &env) }

func freeAddr(t *testing.T) string {
	t.Helper()
	return freeport.MustAddr(t)
}

// writeConfig writes an endpoint configuration for namespace ns that
// verifies the instances of aws (its CA as us-east-2's certificate, its
// STS), serves plaintext, and is changed further by build; it returns the
// file's path.
func writeConfig(t *testing.T, ns string, aws *awstest.Env, build func(*config.Configuration)) string {
	t.Helper()
	dir := t.TempDir()
	certs := filepath.Join(dir, "aws-certs")
	if err := os.MkdirAll(certs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(certs, "us-east-2.pem"), aws.CA.CertificatePEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := configkit.Config(ns)
	cfg.Identity.AWS = config.AWSIdentity{CertificatesDir: certs, STSEndpoint: aws.STS.URL}
	build(cfg)
	return configkit.WriteFile(t, dir, cfg)
}

// The endpoint binary's wiring, from its configuration file to a workload
// registered through its gRPC API, against the real API server.
func TestRunServesTheOnboardingAPI(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ns := env.Namespace(t)
	aws := awstest.Start(t, awstest.Instance{})

	onboardingAddr, metricsAddr, xdsAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	cfgFile := writeConfig(t, ns, aws, func(c *config.Configuration) {
		c.TokenIssuer.JWT.Expiration = configkit.Duration(30 * time.Minute)
		c.Registration.GracePeriod = configkit.Duration(time.Minute)
		c.Mesh.Network = &config.MeshNetwork{Pods: "kube-network"}
		c.Listen = config.Listen{Onboarding: onboardingAddr, Metrics: metricsAddr, XDS: xdsAddr}
	})

	// The example objects (api/crds/testdata/seed004), in the test's namespace.
	policyYAML, err := os.ReadFile("../../../api/crds/testdata/seed004/policy-any-ec2-in-accounts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	policy := &authorizationv1alpha1.OnboardingPolicy{}
	if err := yaml.UnmarshalStrict(policyYAML, policy); err != nil {
		t.Fatal(err)
	}
	policy.Namespace = ns
	if err := env.Client.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	fixtures.CreateGroup(ctx, t, env.Client, fixtures.SeedGroup(ns))

	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{ConfigFile: cfgFile, Kubeconfig: env.KubeconfigPath, Replica: "embark-test-0",
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Ready: ready})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("endpoint not ready")
	}

	conn, err := grpc.NewClient(onboardingAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := onboardingv1alpha1.NewOnboardingServiceClient(conn)
	cred, err := awsclient.Credential(ctx, imds.New(imds.Options{Endpoint: aws.IMDS.URL}), nil, "onboarding-endpoint.example.corp")
	if err != nil {
		t.Fatal(err)
	}
	auth, err := api.Authorize(ctx, &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: ns, Name: "ratings"},
		Credential: &onboardingv1alpha1.AuthorizeRequest_Aws{Aws: &onboardingv1alpha1.AWSCredential{
			InstanceIdentityDocument: cred.Document, Rsa2048Signature: string(cred.Signature),
		}},
	})
	if err != nil {
		t.Fatalf("Authorize: %v", err)
	}
	if d := time.Until(auth.GetExpiresAt().AsTime()); d > 31*time.Minute || d < 29*time.Minute {
		t.Errorf("token lifetime %v, want the configured 30m", d)
	}
	reg, err := api.Register(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+auth.GetToken()), &onboardingv1alpha1.RegisterRequest{
		Addresses: []*onboardingv1alpha1.HostAddress{{Ip: "172.31.5.254", Type: "VPC"}},
	})
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: reg.GetRegistrationName()}, war); err != nil {
		t.Fatalf("registration %s: %v", reg.GetRegistrationName(), err)
	}
	if reg.GetRegistrationName() != "ratings-aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0" {
		t.Errorf("registration name %q", reg.GetRegistrationName())
	}
	// mesh.network reaches the registrar: the seed group's network,
	// virtual-machines, has no gateway in it.
	if c := meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionNetworkTopology); c == nil || c.Reason != "NoNetworkGateway" {
		t.Errorf("NetworkTopology condition %+v, want False/NoNetworkGateway", c)
	}

	// A credential the endpoint does not trust is refused as the API says.
	_, err = api.Authorize(ctx, &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: ns, Name: "ratings"},
		Credential:    &onboardingv1alpha1.AuthorizeRequest_Jwt{Jwt: &onboardingv1alpha1.JWTCredential{Token: "a.b.c"}},
	})
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("JWT without issuers: %v, want Unauthenticated", err)
	}

	// The replica holds its liveness Lease (grace-period removal is wired).
	lease := &coordinationv1.Lease{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: replica.LeaseName("embark-test-0")}, lease); err != nil {
		t.Errorf("replica Lease: %v", err)
	}

	// Metrics and health are served.
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`embark_onboarding_requests_total{code="OK",method="/embark.onboarding.v1alpha1.OnboardingService/Register"} 1`,
		`embark_onboarding_registrations_total{result="created"} 1`,
		`embark_registry_health_writes_total{result="stored"} 0`, // the health mirror is wired
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	resp, err = http.Get("http://" + metricsAddr + "/readyz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("readyz: %v %v", resp, err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run returned %v after shutdown", err)
		}
	case <-time.After(time.Minute):
		t.Error("Run did not stop")
	}
}

func TestRunRefusesABadConfiguration(t *testing.T) {
	cfg := configkit.Config("")
	cfg.Endpoint.Hosts = nil
	cfgFile := configkit.WriteFile(t, t.TempDir(), cfg)
	err := Run(t.Context(), Options{ConfigFile: cfgFile, Kubeconfig: env.KubeconfigPath})
	if err == nil || !strings.Contains(err.Error(), "endpoint.hosts") {
		t.Errorf("err = %v, want it to name endpoint.hosts", err)
	}
}

// A phase that fails after the listeners are open (here the local
// repository, whose directory does not exist) leaves no listener bound and
// no goroutine of Run behind: the listener group closes every listener,
// and Run ends what the phases started.
func TestRunFailingAfterListenLeavesNothingBehind(t *testing.T) {
	ns := env.Namespace(t)
	aws := awstest.Start(t, awstest.Instance{})
	addrs := map[string]string{"onboarding": freeAddr(t), "metrics": freeAddr(t), "xds": freeAddr(t), "repository": freeAddr(t), "debug": freeAddr(t)}
	cfgFile := writeConfig(t, ns, aws, func(c *config.Configuration) {
		c.LocalRepository = &config.LocalRepository{Directory: filepath.Join(t.TempDir(), "no-such-directory")}
		c.Listen = config.Listen{Onboarding: addrs["onboarding"], Metrics: addrs["metrics"], XDS: addrs["xds"], Repository: addrs["repository"]}
	})

	before := goleak.IgnoreCurrent()
	err := Run(t.Context(), Options{ConfigFile: cfgFile, Kubeconfig: env.KubeconfigPath, Replica: "embark-test-fail",
		DebugXDS: addrs["debug"], Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "localRepository.directory") {
		t.Fatalf("Run = %v, want the local repository's directory error", err)
	}
	for name, addr := range addrs {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("%s listener %s still bound after Run failed: %v", name, addr, err)
			continue
		}
		_ = l.Close()
	}
	// Idle keep-alive connections of client-go's shared transports are the
	// process's, not Run's.
	goleak.VerifyNone(t, before,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*http2ClientConn).readLoop"))
}

// The local repository opens every extra directory at start: one that
// does not exist (an operator's volume not mounted) fails Run naming it,
// so the repository never serves without the packages it was given.
func TestRunNeedsTheExtraRepositoryDirectories(t *testing.T) {
	ns := env.Namespace(t)
	aws := awstest.Start(t, awstest.Instance{})
	missing := filepath.Join(t.TempDir(), "istio-sidecar-packages")
	cfgFile := writeConfig(t, ns, aws, func(c *config.Configuration) {
		c.LocalRepository = &config.LocalRepository{Directory: t.TempDir(), ExtraDirectories: []string{missing}}
		c.Listen = config.Listen{Onboarding: freeAddr(t), Metrics: freeAddr(t), XDS: freeAddr(t), Repository: freeAddr(t)}
	})
	err := Run(t.Context(), Options{ConfigFile: cfgFile, Kubeconfig: env.KubeconfigPath, Replica: "embark-test-extra-dirs",
		DebugXDS: freeAddr(t), Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "extraDirectories") || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Run = %v, want the missing extra directory %s named", err, missing)
	}
}
