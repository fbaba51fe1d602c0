package endpoint

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	awscredentials "github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/apicheck"
	awsidentity "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
	awsclient "github.com/embark-mesh/embark/onboarding/identity/aws/client"
	"github.com/embark-mesh/embark/onboarding/identity/aws/profile"
	"github.com/embark-mesh/embark/onboarding/policy"
	"github.com/embark-mesh/embark/onboarding/token"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/registry/boundtoken"
	"github.com/embark-mesh/embark/registry/nodeid"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/testenv"
)

const audience = "onboarding-endpoint.example.corp"

var (
	env      *testenv.Env
	cached   cache.Cache
	recorder record.EventRecorder
)

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{GarbageCollector: true}, &env, func(ctx context.Context) error {
		var err error
		cached, err = env.StartCache(ctx, func(c cache.Cache) error { return registry.SetupIndexes(ctx, c) },
			&istionetworkingv1.WorkloadEntryList{}, &istionetworkingv1.WorkloadGroupList{}, &authorizationv1alpha1.OnboardingPolicyList{})
		if err != nil {
			return err
		}
		recorder, err = env.EventRecorder(ctx, "embark-endpoint-test")
		return err
	})
}

// harness is an onboarding endpoint served over TLS on loopback, with the
// real verifiers, policy authorizer, token issuer and registrar, plus an AWS
// region (CA, STS, EC2/IAM) whose instances agents run on. Unless a test's
// options say otherwise, it is configured as an operator who uses IAM
// roles and debugs denials from a trusted network would: the instance
// profile check on (every instance with a role has that role's instance
// profile) and detailed denials for its loopback clients.
type harness struct {
	t      *testing.T
	ns     string
	aws    *awstest.Env
	west   *awstest.CA
	keys   *token.StaticKeySource
	tokens *token.Issuer
	client onboardingv1alpha1.OnboardingServiceClient
}

func newHarness(t *testing.T, opts ...func(*Options)) *harness {
	t.Helper()
	h := &harness{t: t, ns: env.Namespace(t)}
	h.aws = awstest.Start(t, awstest.Instance{Role: "ratings-role"})
	var err error
	if h.west, err = awstest.NewCA("us-west-2"); err != nil {
		t.Fatal(err)
	}
	verifier, err := awsidentity.NewVerifier(audience,
		awsidentity.WithTrustedCertificates(map[string]*x509.Certificate{"us-east-2": h.aws.CA.Certificate, "us-west-2": h.west.Certificate}),
		awsidentity.WithSTSEndpoint(h.aws.STS.URL))
	if err != nil {
		t.Fatal(err)
	}
	key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	ks, err := token.NewKeySet(key, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.keys = token.NewStaticKeySource(ks)
	if h.tokens, err = token.NewIssuer(h.keys, "https://"+audience, audience); err != nil {
		t.Fatal(err)
	}
	authz, err := policy.NewAuthorizer(cached, recorder)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.NewRegistrar(registry.Options{Client: env.Client, Cache: cached, Recorder: recorder, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{
		AWS: verifier, Authorizer: authz, Tokens: h.tokens, Registrar: reg, Client: cachedClient(t),
		Bootstrap: BootstrapSettings{DiscoveryAddress: audience + ":15012", ClusterID: "Kubernetes", TrustDomain: "cluster.local"},
		Logger:    slog.New(slog.DiscardHandler),

		InstanceProfiles:      profileChecker(t, h.aws.EC2IAM),
		DetailedDenialSources: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
	}
	for _, f := range opts {
		f(&o)
	}
	srv, err := NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	h.client = serve(t, srv)
	return h
}

// profileChecker is the instance profile check with the real EC2 and IAM
// SDK clients pointed at fake (a loopback fake of EC2/IAM, the external
// edge), with a rate the tests do not reach.
func profileChecker(t *testing.T, fake *awstest.EC2IAM) *profile.Checker {
	t.Helper()
	clients, err := profile.NewClients(t.Context(), profile.ClientOptions{EC2Endpoint: fake.URL, IAMEndpoint: fake.URL,
		Credentials: awscredentials.NewStaticCredentialsProvider(fake.AccessKeyID, fake.SecretAccessKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	c, err := profile.New(profile.Options{Clients: clients, Options: apicheck.Options{Rate: 1000, Burst: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// cachedClient reads from the informer cache and writes to the API server,
// as the endpoint's manager client does.
func cachedClient(t *testing.T) client.Client {
	t.Helper()
	c, err := client.New(env.Config, client.Options{Scheme: env.Scheme, Cache: &client.CacheOptions{Reader: cached}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// serve runs srv on a TLS listener on loopback and returns a client that
// trusts its certificate.
func serve(t *testing.T, srv *Server) onboardingv1alpha1.OnboardingServiceClient {
	t.Helper()
	cert, pool := fixtures.SelfSigned(t, audience)
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	srv.RegisterService(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: audience})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return onboardingv1alpha1.NewOnboardingServiceClient(conn)
}

// credential is what the onboarding agent of inst sends, fetched through the
// real AWS SDK clients from the instance's IMDS (and signed for STS when the
// instance has a role).
func (h *harness) credential(m *awstest.IMDS) *onboardingv1alpha1.AuthorizeRequest_Aws {
	h.t.Helper()
	ctx := h.t.Context()
	ic := imds.New(imds.Options{Endpoint: m.URL})
	var sc awsclient.CallerIdentityAPI
	if m.Instance().Role != "" {
		sc = awsclient.NewSTSClient(ic, m.Instance().Region, func(o *sts.Options) { o.BaseEndpoint = &h.aws.STS.URL })
	}
	cred, err := awsclient.Credential(ctx, ic, sc, audience)
	if err != nil {
		h.t.Fatal(err)
	}
	out := awswire.ToProto(cred)
	return &onboardingv1alpha1.AuthorizeRequest_Aws{Aws: out}
}

// instance starts the IMDS of another instance (in us-east-2 unless the
// instance says otherwise).
func (h *harness) instance(inst awstest.Instance) *awstest.IMDS {
	h.t.Helper()
	ca := h.aws.CA
	if inst.Region == "us-west-2" {
		ca = h.west
	}
	return h.aws.AddInstance(h.t, ca, inst)
}

func (h *harness) apply(path string) {
	h.t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		h.t.Fatal(err)
	}
	obj := &authorizationv1alpha1.OnboardingPolicy{}
	if err := yaml.UnmarshalStrict(data, obj); err != nil {
		h.t.Fatal(err)
	}
	obj.Namespace = h.ns
	if err := env.Client.Create(h.t.Context(), obj); err != nil {
		h.t.Fatal(err)
	}
	fixtures.WaitCached(h.t, cached, obj)
}

func (h *harness) group(name string, labels map[string]string) *istionetworkingv1.WorkloadGroup {
	h.t.Helper()
	wg := &istionetworkingv1.WorkloadGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns, Labels: labels}}
	wg.Spec.Template = &istioapi.WorkloadEntry{
		Labels: map[string]string{"app": name, "class": "vm"}, ServiceAccount: name + "-vm", Network: "virtual-machines",
	}
	if err := env.Client.Create(h.t.Context(), wg); err != nil {
		h.t.Fatal(err)
	}
	// Embark never creates the group's service account itself.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name + "-vm", Namespace: h.ns}}
	if err := env.Client.Create(h.t.Context(), sa); err != nil && !apierrors.IsAlreadyExists(err) {
		h.t.Fatal(err)
	}
	fixtures.WaitCached(h.t, cached, wg)
	return wg
}

func (h *harness) authorize(group string, m *awstest.IMDS) (*onboardingv1alpha1.AuthorizeResponse, error) {
	return h.client.Authorize(h.t.Context(), &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: h.ns, Name: group},
		Credential:    h.credential(m),
	})
}

func (h *harness) register(tok string, ip string) (*onboardingv1alpha1.RegisterResponse, error) {
	return h.registerSession(tok, "", ip)
}

// session returns a context with the onboarding token and, unless empty,
// the agent's session key.
func session(ctx context.Context, tok, key string) context.Context {
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, SessionKeyMetadata, key)
	}
	return ctx
}

func (h *harness) registerSession(tok, key, ip string) (*onboardingv1alpha1.RegisterResponse, error) {
	ctx := session(h.t.Context(), tok, key)
	return h.client.Register(ctx, &onboardingv1alpha1.RegisterRequest{
		Addresses:           []*onboardingv1alpha1.HostAddress{{Ip: ip, Type: "VPC"}},
		ConnectedOver:       "VPC",
		AgentVersion:        "v1.4.0",
		IstioSidecarVersion: "1.9.8-15bc6e5e32",
		Labels:              map[string]string{"version": "v5"},
	})
}

func TestSeed004PoliciesAgainstIdentities(t *testing.T) {
	tests := []struct {
		name     string
		policy   string
		group    string
		labels   map[string]string
		instance awstest.Instance
		wantCode codes.Code
		wantMsg  string
	}{
		{name: "narrow: matching instance", policy: "narrow", group: "ratings", labels: map[string]string{"app": "ratings"},
			instance: awstest.Instance{Role: "ratings-role"}, wantCode: codes.OK},
		{name: "narrow: other account", policy: "narrow", group: "ratings", labels: map[string]string{"app": "ratings"},
			instance: awstest.Instance{Account: "999999999999", Role: "ratings-role", InstanceID: "i-0aaaaaaaaaaaaaaa1"}, wantCode: codes.PermissionDenied, wantMsg: "account 999999999999"},
		{name: "narrow: other zone", policy: "narrow", group: "ratings", labels: map[string]string{"app": "ratings"},
			instance: awstest.Instance{Zone: "us-east-2a", Role: "ratings-role", InstanceID: "i-0aaaaaaaaaaaaaaa2"}, wantCode: codes.PermissionDenied, wantMsg: "zone us-east-2a"},
		{name: "narrow: other region", policy: "narrow", group: "ratings", labels: map[string]string{"app": "ratings"},
			instance: awstest.Instance{Region: "us-west-2", Role: "ratings-role", InstanceID: "i-0aaaaaaaaaaaaaaa3"}, wantCode: codes.PermissionDenied, wantMsg: "region us-west-2"},
		{name: "narrow: other role", policy: "narrow", group: "ratings", labels: map[string]string{"app": "ratings"},
			instance: awstest.Instance{Role: "details-role", InstanceID: "i-0aaaaaaaaaaaaaaa4"}, wantCode: codes.PermissionDenied, wantMsg: "details-role"},
		{name: "narrow: no role to prove", policy: "narrow", group: "ratings", labels: map[string]string{"app": "ratings"},
			instance: awstest.Instance{InstanceID: "i-0aaaaaaaaaaaaaaa5"}, wantCode: codes.PermissionDenied, wantMsg: "iam role"},
		{name: "narrow: group labels not selected", policy: "narrow", group: "details", labels: map[string]string{"app": "details"},
			instance: awstest.Instance{Role: "ratings-role", InstanceID: "i-0aaaaaaaaaaaaaaa6"}, wantCode: codes.PermissionDenied, wantMsg: "not selected by"},
		{name: "wide: any instance of the account, any group", policy: "wide", group: "details", labels: map[string]string{"app": "details"},
			instance: awstest.Instance{Zone: "us-east-2c", InstanceID: "i-0aaaaaaaaaaaaaaa7"}, wantCode: codes.OK},
		{name: "wide: second listed account", policy: "wide", group: "ratings",
			instance: awstest.Instance{Account: "234567890123", InstanceID: "i-0aaaaaaaaaaaaaaa8"}, wantCode: codes.OK},
		{name: "wide: unlisted account", policy: "wide", group: "ratings",
			instance: awstest.Instance{Account: "345678901234", InstanceID: "i-0aaaaaaaaaaaaaaa9"}, wantCode: codes.PermissionDenied, wantMsg: "345678901234"},
	}
	files := map[string]string{
		"narrow": narrowPolicy,
		"wide":   widePolicy,
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.apply(files[tt.policy])
			h.group(tt.group, tt.labels)
			resp, err := h.authorize(tt.group, h.instance(tt.instance))
			if got := status.Code(err); got != tt.wantCode {
				t.Fatalf("code = %v (%v), want %v", got, err, tt.wantCode)
			}
			if err != nil {
				if msg := status.Convert(err).Message(); !strings.Contains(msg, tt.wantMsg) || !strings.Contains(msg, tt.group) {
					t.Errorf("message %q does not name %q and the group", msg, tt.wantMsg)
				}
				return
			}
			if resp.GetToken() == "" || resp.GetNamespace() != h.ns || !strings.HasPrefix(resp.GetRegistrationName(), tt.group+"-aws-aws-") {
				t.Errorf("response = %v", resp)
			}
		})
	}
}

func TestOnboardRegisterRenewUnregister(t *testing.T) {
	ctx := t.Context()
	h := ratingsHarness(t, narrowPolicy)

	auth, err := h.authorize("ratings", h.aws.IMDS)
	if err != nil {
		t.Fatal(err)
	}
	const seedName = "ratings-aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0"
	if auth.GetRegistrationName() != seedName {
		t.Errorf("registration name %q, want the seed's %q", auth.GetRegistrationName(), seedName)
	}
	if d := time.Until(auth.GetExpiresAt().AsTime()); d < 59*time.Minute || d > time.Hour+time.Minute {
		t.Errorf("token lifetime %v, want 1h", d)
	}

	reg, err := h.register(auth.GetToken(), "172.31.5.254")
	if err != nil {
		t.Fatal(err)
	}
	boot := reg.GetBootstrap()
	if reg.GetRegistrationName() != seedName || boot.GetNodeId() != nodeid.Build("172.31.5.254", types.NamespacedName{Namespace: h.ns, Name: seedName}) {
		t.Errorf("register response = %v", reg)
	}
	if boot.GetServiceAccount() != "ratings-vm" || boot.GetNetwork() != "virtual-machines" || boot.GetDiscoveryAddress() != audience+":15012" || boot.GetLabels()["version"] != "v5" {
		t.Errorf("bootstrap = %v", boot)
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: h.ns, Name: seedName}, war); err != nil {
		t.Fatal(err)
	}
	if war.Spec.Identity.AWS.EC2.IAMRole != "ratings-role" || war.Spec.Registration.Agent.Version != "v1.4.0" {
		t.Errorf("registration spec = %+v", war.Spec)
	}
	we := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: h.ns, Name: seedName}, we); err != nil {
		t.Fatal(err)
	}
	if we.Spec.Address != "172.31.5.254" || we.Spec.Locality != "us-east-2/us-east-2b" || we.Annotations[registry.AnnotationWorkloadGroup] != "ratings" {
		t.Errorf("WorkloadEntry = %v %v", we.Annotations, &we.Spec)
	}

	// Renewal: a fresh credential before expiry gives a new token and the
	// same registration.
	renewed, err := h.authorize("ratings", h.aws.IMDS)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.registerSession(renewed.GetToken(), reg.GetSessionKey(), "172.31.5.254"); err != nil {
		t.Fatal(err)
	}
	list := &runtimev1alpha1.WorkloadAutoRegistrationList{}
	if err := env.Client.List(ctx, list, client.InNamespace(h.ns)); err != nil || len(list.Items) != 1 || list.Items[0].UID != war.UID {
		t.Fatalf("after renewal: %d registrations (%v), want the one", len(list.Items), err)
	}

	// Graceful shutdown.
	if _, err := h.client.Unregister(session(ctx, renewed.GetToken(), ""), &onboardingv1alpha1.UnregisterRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("unregister without the session key: %v, want PermissionDenied", err)
	}
	out, err := h.client.Unregister(session(ctx, renewed.GetToken(), reg.GetSessionKey()), &onboardingv1alpha1.UnregisterRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if out.GetPropagationDelay().AsDuration() != 5*time.Second {
		t.Errorf("propagation delay = %v", out.GetPropagationDelay().AsDuration())
	}
	fixtures.WaitGone(t, env.Client, war)
	fixtures.WaitGone(t, env.Client, we)
}

func TestReusedDocumentOfALiveRegistration(t *testing.T) {
	ctx := t.Context()
	h := ratingsHarness(t, widePolicy)
	noRole := h.instance(awstest.Instance{InstanceID: "i-0bbbbbbbbbbbbbbb1", PrivateIP: "10.0.0.10"})
	auth, err := h.authorize("ratings", noRole)
	if err != nil {
		t.Fatal(err)
	}
	first, err := h.register(auth.GetToken(), "10.0.0.10")
	if err != nil {
		t.Fatal(err)
	}
	// The workload's sidecar is connected (the xDS server writes this).
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: h.ns, Name: auth.GetRegistrationName()}, war); err != nil {
		t.Fatal(err)
	}
	war.Status.Conditions = []metav1.Condition{{Type: runtimev1alpha1.ConditionAgentConnected, Status: metav1.ConditionTrue, Reason: runtimev1alpha1.ReasonAgentEstablishedConnection, LastTransitionTime: metav1.Now()}}
	if err := env.Client.Status().Update(ctx, war); err != nil {
		t.Fatal(err)
	}
	fixtures.WaitCached(t, cached, war)
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := cached.Get(ctx, client.ObjectKeyFromObject(war), got); err != nil {
			return false, err
		}
		return len(got.Status.Conditions) > 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// A copy of the document presented from elsewhere, with no STS proof:
	// the document proves only its own address, and without the agent's
	// session key it cannot take the registration over.
	copied, err := h.authorize("ratings", noRole)
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.register(copied.GetToken(), "10.9.9.9")
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "not proven") {
		t.Fatalf("err = %v, want PermissionDenied for an unproven address", err)
	}
	_, err = h.register(copied.GetToken(), "10.0.0.10")
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "another agent session") {
		t.Fatalf("err = %v, want PermissionDenied for a takeover without STS", err)
	}
	// The agent itself, with its session key, registers again.
	if _, err := h.registerSession(copied.GetToken(), first.GetSessionKey(), "10.0.0.10"); err != nil {
		t.Errorf("same session: %v", err)
	}
	got := &istionetworkingv1.WorkloadEntry{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: h.ns, Name: auth.GetRegistrationName()}, got); err != nil || got.Spec.Address != "10.0.0.10" {
		t.Errorf("WorkloadEntry address %q (%v), want the original", got.Spec.Address, err)
	}
}

func TestMissingWorkloadGroupIsAFailedPrecondition(t *testing.T) {
	h := newHarness(t)
	h.apply(widePolicy)
	_, err := h.authorize("ratings", h.aws.IMDS)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "ratings") {
		t.Errorf("err = %v, want FailedPrecondition naming the group", err)
	}
}

// A WorkloadGroup outside the configured workload namespaces is refused
// before any verification, naming the namespace; so is an onboarding token
// of such a namespace (one removed from the configuration after the token
// was issued).
func TestNamespaceNotServedIsAFailedPrecondition(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Namespaces = []string{"bookinfo", "vms"} })
	h.group("ratings", map[string]string{"app": "ratings"})
	h.apply(narrowPolicy)
	if _, err := h.authorize("ratings", h.aws.IMDS); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `"`+h.ns+`"`) {
		t.Errorf("Authorize in %s = %v, want FailedPrecondition naming the namespace", h.ns, err)
	}
	tok, _, err := h.tokens.Issue(token.Request{Namespace: h.ns, Name: "ratings-x", WorkloadGroup: "ratings", WorkloadIdentity: "x",
		Verified: &runtimev1alpha1.WorkloadIdentity{AWS: &runtimev1alpha1.AWSIdentity{Partition: "aws", Account: "123456789012", Region: "us-east-2", Zone: "us-east-2b",
			EC2: &runtimev1alpha1.EC2Identity{InstanceID: "i-1234567890abcdef0"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.register(tok, "172.31.5.254"); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `"`+h.ns+`"`) {
		t.Errorf("Register with a token of %s = %v, want FailedPrecondition naming the namespace", h.ns, err)
	}
}

// For a source that may not see details (the default: every source), a
// namespace the endpoint does not serve is answered as any denial: the
// generic PERMISSION_DENIED, naming neither it nor the configured ones.
func TestNamespaceNotServedIsAGenericDenial(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Namespaces, o.DetailedDenialSources = []string{"bookinfo", "vms"}, nil })
	h.group("ratings", map[string]string{"app": "ratings"})
	h.apply(narrowPolicy)
	_, err := h.authorize("ratings", h.aws.IMDS)
	msg := status.Convert(err).Message()
	if status.Code(err) != codes.PermissionDenied || !strings.HasPrefix(msg, "not authorized to onboard (request id ") {
		t.Errorf("Authorize in %s = %v, want the generic PermissionDenied", h.ns, err)
	}
	for _, s := range []string{h.ns, "bookinfo", "vms", "namespace"} {
		if strings.Contains(msg, s) {
			t.Errorf("the denial %q discloses %q", msg, s)
		}
	}
}

func TestPolicyChangesTakeEffectWithoutRestart(t *testing.T) {
	h := newHarness(t)
	h.group("ratings", map[string]string{"app": "ratings"})
	if _, err := h.authorize("ratings", h.aws.IMDS); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "no OnboardingPolicy") {
		t.Fatalf("without a policy: %v, want PermissionDenied", err)
	}
	h.apply(narrowPolicy)
	if _, err := h.authorize("ratings", h.aws.IMDS); err != nil {
		t.Fatalf("after the policy was created: %v", err)
	}
}

// STS that cannot answer is not a refusal: Authorize answers Unavailable
// (the agent retries with backoff) and a retry succeeds once STS is back.
// STS refusing the signed request stays Unauthenticated. STS is the
// loopback fake (a true external edge), reached through the real SDK's
// signed request.
func TestSTSUnavailableIsRetryableRefusedIsNot(t *testing.T) {
	tests := []struct {
		name     string
		breakSTS func(h *harness)
		wantCode codes.Code
		wantMsg  string
		retryOK  bool // a fresh credential succeeds once STS is back
	}{
		{name: "STS unreachable", breakSTS: func(h *harness) { h.aws.STS.Close() }, wantCode: codes.Unavailable, wantMsg: "STSUnavailable"},
		{name: "STS throttling (400 Throttling)", breakSTS: func(h *harness) { h.aws.STS.SetOutage("Throttling") }, wantCode: codes.Unavailable, wantMsg: "Throttling", retryOK: true},
		{name: "STS failing (503)", breakSTS: func(h *harness) { h.aws.STS.SetOutage("ServiceUnavailable") }, wantCode: codes.Unavailable, wantMsg: "503", retryOK: true},
		{name: "STS refuses revoked role credentials", breakSTS: func(h *harness) {
			c, _ := h.aws.IMDS.RoleCredentials()
			h.aws.STS.Revoke(c.AccessKeyID)
		}, wantCode: codes.Unauthenticated, wantMsg: "InvalidClientTokenId"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := ratingsHarness(t, narrowPolicy)
			req := &onboardingv1alpha1.AuthorizeRequest{
				WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: h.ns, Name: "ratings"},
				Credential:    h.credential(h.aws.IMDS),
			}
			if req.GetAws().GetStsGetCallerIdentity() == nil {
				t.Fatal("the instance's credential carries no signed STS request")
			}
			tt.breakSTS(h)
			_, err := h.client.Authorize(t.Context(), req)
			if status.Code(err) != tt.wantCode || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("Authorize = %v, want %s mentioning %q", err, tt.wantCode, tt.wantMsg)
			}
			if !tt.retryOK {
				return
			}
			h.aws.STS.ClearOutage()
			if _, err := h.authorize("ratings", h.aws.IMDS); err != nil {
				t.Errorf("retry after the outage: %v", err)
			}
		})
	}
}

func TestBadTokensAreUnauthenticated(t *testing.T) {
	h := ratingsHarness(t, narrowPolicy)
	req := token.Request{Namespace: h.ns, Name: "ratings-x", WorkloadGroup: "ratings", WorkloadIdentity: "aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0",
		Verified: &runtimev1alpha1.WorkloadIdentity{AWS: &runtimev1alpha1.AWSIdentity{Partition: "aws", Account: "123456789012", Region: "us-east-2", Zone: "us-east-2b",
			EC2: &runtimev1alpha1.EC2Identity{InstanceID: "i-1234567890abcdef0", IAMRole: "ratings-role"}}}}
	otherKey, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	otherSet, err := token.NewKeySet(otherKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(keys token.KeySource, aud string, opts ...token.Option) string {
		iss, err := token.NewIssuer(keys, "https://"+audience, aud, opts...)
		if err != nil {
			t.Fatal(err)
		}
		raw, _, err := iss.Issue(req)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	tests := []struct {
		name    string
		token   string
		wantMsg string
	}{
		{name: "expired", token: issue(h.keys, audience, token.WithClock(func() time.Time { return time.Now().Add(-2 * time.Hour) })), wantMsg: "expired"},
		{name: "wrong audience", token: issue(h.keys, "another-plane.example"), wantMsg: "audience"},
		{name: "wrong key", token: issue(token.NewStaticKeySource(otherSet), audience), wantMsg: "key"},
		{name: "garbage", token: "not-a-jwt", wantMsg: "onboarding token refused"},
		{name: "none", token: "", wantMsg: "missing onboarding token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			if tt.token != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tt.token)
			}
			_, err := h.client.Register(ctx, &onboardingv1alpha1.RegisterRequest{Addresses: []*onboardingv1alpha1.HostAddress{{Ip: "10.1.1.1", Type: "VPC"}}})
			if status.Code(err) != codes.Unauthenticated || !strings.Contains(strings.ToLower(err.Error()), tt.wantMsg) {
				t.Errorf("err = %v, want Unauthenticated mentioning %q", err, tt.wantMsg)
			}
		})
	}
	assertNoRegistrations(t, h.ns)
}

func TestMalformedRequestsAreRefused(t *testing.T) {
	h := newHarness(t)
	h.group("ratings", nil)
	tests := []struct {
		name     string
		req      *onboardingv1alpha1.AuthorizeRequest
		wantCode codes.Code
		wantMsg  string
	}{
		{name: "no group", req: &onboardingv1alpha1.AuthorizeRequest{Credential: h.credential(h.aws.IMDS)}, wantCode: codes.InvalidArgument, wantMsg: "workload_group"},
		{name: "bad namespace", req: &onboardingv1alpha1.AuthorizeRequest{WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: "Bad_NS", Name: "ratings"}, Credential: h.credential(h.aws.IMDS)}, wantCode: codes.InvalidArgument, wantMsg: "workload_group.namespace"},
		{name: "no credential", req: &onboardingv1alpha1.AuthorizeRequest{WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: h.ns, Name: "ratings"}}, wantCode: codes.InvalidArgument, wantMsg: "credential"},
		{name: "forged document", req: &onboardingv1alpha1.AuthorizeRequest{
			WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: h.ns, Name: "ratings"},
			Credential: &onboardingv1alpha1.AuthorizeRequest_Aws{Aws: &onboardingv1alpha1.AWSCredential{
				InstanceIdentityDocument: []byte(`{"accountId":"123456789012","region":"us-east-2"}`), Rsa2048Signature: string(h.aws.IMDS.Signature()),
			}},
		}, wantCode: codes.Unauthenticated, wantMsg: "platform credential refused"},
		{name: "jwt not configured", req: &onboardingv1alpha1.AuthorizeRequest{
			WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: h.ns, Name: "ratings"},
			Credential:    &onboardingv1alpha1.AuthorizeRequest_Jwt{Jwt: &onboardingv1alpha1.JWTCredential{Token: "a.b.c"}},
		}, wantCode: codes.Unauthenticated, wantMsg: "trusts no JWT issuer"},
		{name: "azure not configured", req: &onboardingv1alpha1.AuthorizeRequest{
			WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: h.ns, Name: "ratings"},
			Credential:    &onboardingv1alpha1.AuthorizeRequest_Azure{Azure: &onboardingv1alpha1.AzureCredential{Token: "a.b.c"}},
		}, wantCode: codes.Unauthenticated, wantMsg: "identity.azure is not configured"},
		{name: "empty azure token", req: &onboardingv1alpha1.AuthorizeRequest{
			WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: h.ns, Name: "ratings"},
			Credential:    &onboardingv1alpha1.AuthorizeRequest_Azure{Azure: &onboardingv1alpha1.AzureCredential{}},
		}, wantCode: codes.InvalidArgument, wantMsg: "azure.token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.client.Authorize(t.Context(), tt.req)
			if status.Code(err) != tt.wantCode || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("err = %v, want %v mentioning %q", err, tt.wantCode, tt.wantMsg)
			}
		})
	}
}

func assertNoRegistrations(t *testing.T, ns string) {
	t.Helper()
	list := &runtimev1alpha1.WorkloadAutoRegistrationList{}
	if err := env.Client.List(t.Context(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Errorf("%d registrations written", len(list.Items))
	}
}

func TestBootstrapCarriesARenewableSidecarToken(t *testing.T) {
	ctx := t.Context()
	h := ratingsHarness(t, narrowPolicy)
	auth, err := h.authorize("ratings", h.aws.IMDS)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := h.register(auth.GetToken(), "172.31.5.254")
	if err != nil {
		t.Fatal(err)
	}
	boot := reg.GetBootstrap()
	first, err := boundtoken.Decode(boot.GetSidecarToken())
	if err != nil {
		t.Fatalf("bootstrap sidecar token: %v", err)
	}
	secretName, secretUID, ok := first.SecretRef()
	if !ok || secretName != registry.SidecarSecretName(reg.GetRegistrationName()) || first.Kubernetes.ServiceAccount.Name != "ratings-vm" {
		t.Errorf("sidecar token claims = %+v", first.Kubernetes)
	}
	if d := time.Until(boot.GetSidecarTokenExpiresAt().AsTime()); d < 55*time.Minute || d > time.Hour+time.Minute {
		t.Errorf("sidecar token lifetime %v, want 1h", d)
	}

	renewCtx := session(ctx, auth.GetToken(), reg.GetSessionKey())
	renewed, err := h.client.RenewSidecarToken(renewCtx, &onboardingv1alpha1.RenewSidecarTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := boundtoken.Decode(renewed.GetSidecarToken())
	if err != nil {
		t.Fatal(err)
	}
	if _, uid, _ := rc.SecretRef(); uid != secretUID || rc.ID == first.ID || renewed.GetExpiresAt() == nil {
		t.Errorf("renewed token: secret %s (want %s), jti %s (first %s)", uid, secretUID, rc.ID, first.ID)
	}

	// Without an onboarding token, or after the registration is gone, no token.
	if _, err := h.client.RenewSidecarToken(ctx, &onboardingv1alpha1.RenewSidecarTokenRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("renew without onboarding token: %v, want Unauthenticated", err)
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: h.ns, Name: reg.GetRegistrationName()}, war); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, war); err != nil {
		t.Fatal(err)
	}
	fixtures.WaitGone(t, env.Client, war)
	if _, err := h.client.RenewSidecarToken(renewCtx, &onboardingv1alpha1.RenewSidecarTokenRequest{}); status.Code(err) != codes.NotFound {
		t.Errorf("renew after the registration was deleted: %v, want NotFound", err)
	}
}

func TestMissingServiceAccountIsAFailedPrecondition(t *testing.T) {
	h := newHarness(t)
	h.apply(narrowPolicy)
	wg := &istionetworkingv1.WorkloadGroup{ObjectMeta: metav1.ObjectMeta{Name: "ratings", Namespace: h.ns, Labels: map[string]string{"app": "ratings"}}}
	wg.Spec.Template = &istioapi.WorkloadEntry{Labels: map[string]string{"app": "ratings"}, ServiceAccount: "nobody-made-me", Network: "virtual-machines"}
	if err := env.Client.Create(t.Context(), wg); err != nil {
		t.Fatal(err)
	}
	fixtures.WaitCached(t, cached, wg)
	auth, err := h.authorize("ratings", h.aws.IMDS)
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.register(auth.GetToken(), "172.31.5.254")
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), h.ns+"/nobody-made-me") {
		t.Errorf("register: %v, want FailedPrecondition naming %s/nobody-made-me", err, h.ns)
	}
	assertNoRegistrations(t, h.ns)
}
