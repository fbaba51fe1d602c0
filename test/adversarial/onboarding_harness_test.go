package adversarial

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	jose "github.com/go-jose/go-jose/v4"
	josejwt "github.com/go-jose/go-jose/v4/jwt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	istioapi "istio.io/api/networking/v1"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/endpoint"
	awsidentity "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
	awsclient "github.com/embark-mesh/embark/onboarding/identity/aws/client"
	jwtidentity "github.com/embark-mesh/embark/onboarding/identity/jwt"
	"github.com/embark-mesh/embark/onboarding/identity/replay/kubestore"
	"github.com/embark-mesh/embark/onboarding/policy"
	"github.com/embark-mesh/embark/onboarding/token"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/fixtures"
)

// The onboarding attacks run against the real onboarding endpoint (in
// process, over TLS on loopback) with the real verifiers, policy authorizer,
// token issuer and registrar, on the package's real kube-apiserver. AWS
// (IMDS, STS) is a loopback fake behind the real aws-sdk-go-v2 clients, and
// JWT issuers are loopback JWKS servers: those are the external edges.

const audience = "onboarding-endpoint.example.corp"

// serviceCIDR is the cluster Service range the endpoint is told about.
var serviceCIDR = netip.MustParsePrefix("10.96.0.0/12")

var (
	cacheOnce sync.Once
	cacheErr  error
	cached    cache.Cache
	recorder  record.EventRecorder
)

// sharedCache starts, once, the informer cache and Event recorder every
// onboarding attack's endpoint uses (the endpoint's own wiring).
func sharedCache(t *testing.T) cache.Cache {
	t.Helper()
	cacheOnce.Do(func() {
		ctx := context.Background() // lives as long as the test process
		cached, cacheErr = env.StartCache(ctx, func(c cache.Cache) error { return registry.SetupIndexes(ctx, c) },
			&istionetworkingv1.WorkloadEntryList{}, &istionetworkingv1.WorkloadGroupList{},
			&authorizationv1alpha1.OnboardingPolicyList{}, &runtimev1alpha1.WorkloadAutoRegistrationList{})
		if cacheErr == nil {
			recorder, cacheErr = env.EventRecorder(ctx, "embark-adversarial")
		}
	})
	if cacheErr != nil {
		t.Fatal(cacheErr)
	}
	return cached
}

// jwtIssuer is a loopback OIDC issuer: a key and a JWKS served over TLS.
type jwtIssuer struct {
	url    string
	short  string
	key    *ecdsa.PrivateKey
	server *httptest.Server
}

func newJWTIssuer(t *testing.T, short string) *jwtIssuer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	is := &jwtIssuer{short: short, key: key}
	is.server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJWKS(w, &key.PublicKey)
	}))
	t.Cleanup(is.server.Close)
	is.url = "https://" + short + ".idp.example"
	return is
}

func writeJWKS(w http.ResponseWriter, pub *ecdsa.PublicKey) {
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: pub, KeyID: "k1", Algorithm: string(jose.ES256), Use: "sig"}}}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(set)
}

// mint signs a token of the issuer for subject with key (the issuer's own
// key when nil).
func (is *jwtIssuer) mint(t *testing.T, subject string, key *ecdsa.PrivateKey) string {
	t.Helper()
	if key == nil {
		key = is.key
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, (&jose.SignerOptions{}).WithHeader("kid", "k1").WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	raw, err := josejwt.Signed(signer).Claims(josejwt.Claims{
		Issuer: is.url, Subject: subject, Audience: josejwt.Audience{audience}, ID: rand.Text(),
		IssuedAt: josejwt.NewNumericDate(now), Expiry: josejwt.NewNumericDate(now.Add(10 * time.Minute)),
	}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// onboarding is one endpoint and the namespace its attacks use.
type onboarding struct {
	t      *testing.T
	ns     string
	aws    *awstest.Env
	client onboardingv1alpha1.OnboardingServiceClient
}

type onboardingOptions struct {
	issuers []*jwtIssuer
	// jwksURL overrides an issuer's JWKS URL (by short name).
	jwksURL map[string]string
	// profiles, when set, is the endpoint's EC2 instance profile check.
	profiles endpoint.InstanceProfileChecker
	// profileCheck, when profiles is nil, turns the instance profile check
	// on against the harness's own EC2/IAM fake, which gives every
	// instance with a role the instance profile of that role.
	profileCheck bool
	// detailed tells the attacker's own source (loopback) why it is
	// denied, as endpoint.detailedDenialSources does for trusted networks.
	detailed bool
	// logger, when set, is the endpoint's logger. Default: discard.
	logger *slog.Logger
	// gce, when set, verifies GCE instance identity tokens.
	gce endpoint.GCEVerifier
	// azure, when set, verifies Azure VM managed identity tokens.
	azure endpoint.AzureVerifier
	// ecs, when set, makes the ECS verifier on the endpoint's AWS verifier.
	ecs func(*awsidentity.Verifier) endpoint.ECSVerifier
	// peer, when set, makes this endpoint another replica of peer's
	// deployment: the same namespace and the same AWS (IMDS, STS).
	peer *onboarding
	// tokenClock, when set, is the onboarding token issuer's clock (it
	// issues and verifies by it). Default time.Now.
	tokenClock func() time.Time
}

func newOnboarding(t *testing.T, o onboardingOptions) *onboarding {
	t.Helper()
	c := sharedCache(t)
	h := &onboarding{t: t}
	if o.peer != nil {
		h.ns, h.aws = o.peer.ns, o.peer.aws
	} else {
		h.ns, h.aws = env.Namespace(t), awstest.Start(t, awstest.Instance{Role: "ratings-role"})
	}
	used := usedCredentials(t, h.ns)
	verifier, err := awsidentity.NewVerifier(audience,
		awsidentity.WithTrustedCertificates(map[string]*x509.Certificate{"us-east-2": h.aws.CA.Certificate}),
		awsidentity.WithSTSEndpoint(h.aws.STS.URL), awsidentity.WithSharedReplay(used))
	if err != nil {
		t.Fatal(err)
	}
	opts := endpoint.Options{AWS: verifier, InstanceProfiles: o.profiles, GCE: o.gce, Azure: o.azure}
	if o.ecs != nil {
		opts.ECS = o.ecs(verifier)
	}
	if o.profiles == nil && o.profileCheck {
		opts.InstanceProfiles = profileChecker(t, h.aws.EC2IAM)
	}
	if len(o.issuers) > 0 {
		var cfgs []jwtidentity.IssuerConfig
		pool := x509.NewCertPool()
		for _, is := range o.issuers {
			u := is.server.URL + "/keys"
			if v, ok := o.jwksURL[is.short]; ok {
				u = v
			}
			cfgs = append(cfgs, jwtidentity.IssuerConfig{Issuer: is.url, ShortName: is.short, Audiences: []string{audience}, JWKSURL: u})
			pool.AddCert(is.server.Certificate())
		}
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
		jv, err := jwtidentity.NewVerifier(cfgs, jwtidentity.WithHTTPClient(hc), jwtidentity.WithSharedReplay(used))
		if err != nil {
			t.Fatal(err)
		}
		opts.JWT = jv
	}
	key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	ks, err := token.NewKeySet(key, nil)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Tokens, err = token.NewIssuer(token.NewStaticKeySource(ks), "https://"+audience, audience, token.WithClock(o.tokenClock)); err != nil {
		t.Fatal(err)
	}
	if opts.Authorizer, err = policy.NewAuthorizer(c, recorder); err != nil {
		t.Fatal(err)
	}
	if opts.Registrar, err = registry.NewRegistrar(registry.Options{Client: env.Client, Cache: c, Recorder: recorder, Logger: slog.New(slog.DiscardHandler)}); err != nil {
		t.Fatal(err)
	}
	if opts.Client, err = client.New(env.Config, client.Options{Scheme: env.Scheme, Cache: &client.CacheOptions{Reader: c}}); err != nil {
		t.Fatal(err)
	}
	opts.Bootstrap = endpoint.BootstrapSettings{DiscoveryAddress: audience + ":15012", ClusterID: "Kubernetes", TrustDomain: "cluster.local"}
	opts.Logger = slog.New(slog.DiscardHandler)
	if o.logger != nil {
		opts.Logger = o.logger
	}
	if o.detailed {
		opts.DetailedDenialSources = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	}
	opts.ServiceCIDRs = []netip.Prefix{serviceCIDR}
	opts.Recorder = recorder
	srv, err := endpoint.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	h.client = serveOnboarding(t, srv)
	return h
}

// usedCredentials is an endpoint replica's record of used single-use
// credentials, shared with the other replicas in namespace ns (the
// endpoint's own wiring, with the namespace standing for the endpoint's).
func usedCredentials(t *testing.T, ns string) *kubestore.Store {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	s, err := kubestore.New(kubestore.Options{Leases: cs.CoordinationV1(), Namespace: ns, Replica: "replica-" + strings.ToLower(rand.Text()[:8])})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func serveOnboarding(t *testing.T, srv *endpoint.Server) onboardingv1alpha1.OnboardingServiceClient {
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

// instance starts another EC2 instance's IMDS (us-east-2, sharing the STS).
func (h *onboarding) instance(inst awstest.Instance) *awstest.IMDS {
	h.t.Helper()
	return h.aws.AddInstance(h.t, nil, inst)
}

// awsCredential is what the agent on m sends, through the real AWS SDK:
// the document, its signature and, when withSTS and the instance has a
// role, a signed sts:GetCallerIdentity request.
func (h *onboarding) awsCredential(m *awstest.IMDS, withSTS bool) *onboardingv1alpha1.AuthorizeRequest_Aws {
	h.t.Helper()
	ic := imds.New(imds.Options{Endpoint: m.URL})
	var sc awsclient.CallerIdentityAPI
	if withSTS && m.Instance().Role != "" {
		sc = awsclient.NewSTSClient(ic, m.Instance().Region, func(o *sts.Options) { o.BaseEndpoint = &h.aws.STS.URL })
	}
	cred, err := awsclient.Credential(h.t.Context(), ic, sc, audience)
	if err != nil {
		h.t.Fatal(err)
	}
	return &onboardingv1alpha1.AuthorizeRequest_Aws{Aws: awswire.ToProto(cred)}
}

func (h *onboarding) authorizeAWS(group string, m *awstest.IMDS, withSTS bool) (*onboardingv1alpha1.AuthorizeResponse, error) {
	return h.client.Authorize(h.t.Context(), &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: h.ns, Name: group},
		Credential:    h.awsCredential(m, withSTS),
	})
}

func (h *onboarding) authorizeJWT(group, raw string) (*onboardingv1alpha1.AuthorizeResponse, error) {
	return h.client.Authorize(h.t.Context(), &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: h.ns, Name: group},
		Credential:    &onboardingv1alpha1.AuthorizeRequest_Jwt{Jwt: &onboardingv1alpha1.JWTCredential{Token: raw}},
	})
}

// call returns a context carrying the onboarding token and, if not empty,
// the agent session key.
func (h *onboarding) call(tok, session string) context.Context {
	ctx := metadata.AppendToOutgoingContext(h.t.Context(), "authorization", "Bearer "+tok)
	if session != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, endpoint.SessionKeyMetadata, session)
	}
	return ctx
}

func (h *onboarding) register(tok, session, ip, typ string) (*onboardingv1alpha1.RegisterResponse, error) {
	return h.client.Register(h.call(tok, session), &onboardingv1alpha1.RegisterRequest{
		Addresses:     []*onboardingv1alpha1.HostAddress{{Ip: ip, Type: typ}},
		ConnectedOver: typ,
		AgentVersion:  "v1.4.0",
	})
}

// policy creates an OnboardingPolicy in the namespace and waits until the
// endpoint's cache has it.
func (h *onboarding) policy(name string, rules ...authorizationv1alpha1.AllowRule) *authorizationv1alpha1.OnboardingPolicy {
	h.t.Helper()
	p := &authorizationv1alpha1.OnboardingPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns}, Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: rules}}
	if err := env.Client.Create(h.t.Context(), p); err != nil {
		h.t.Fatal(err)
	}
	waitCached(h.t, p)
	return p
}

// group creates a WorkloadGroup (network virtual-machines) and its service
// account.
func (h *onboarding) group(name string) *istionetworkingv1.WorkloadGroup {
	h.t.Helper()
	wg := &istionetworkingv1.WorkloadGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns, Labels: map[string]string{"app": name}}}
	wg.Spec.Template = &istioapi.WorkloadEntry{Labels: map[string]string{"app": name, "class": "vm"}, ServiceAccount: name + "-vm", Network: "virtual-machines"}
	if err := env.Client.Create(h.t.Context(), wg); err != nil {
		h.t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name + "-vm", Namespace: h.ns}}
	if err := env.Client.Create(h.t.Context(), sa); err != nil && !apierrors.IsAlreadyExists(err) {
		h.t.Fatal(err)
	}
	waitCached(h.t, wg)
	return wg
}

// anyEC2 allows any EC2 instance of the fake's account into every group.
func anyEC2() authorizationv1alpha1.AllowRule {
	return authorizationv1alpha1.AllowRule{
		Workloads: []authorizationv1alpha1.WorkloadMatcher{{AWS: &authorizationv1alpha1.AWSMatcher{Accounts: []string{fixtures.Account}, EC2: &authorizationv1alpha1.EC2Matcher{}}}},
		OnboardTo: []authorizationv1alpha1.OnboardTarget{{}},
	}
}

// jwtRule allows the issuer's hosts with addresses in cidrs.
func jwtRule(is *jwtIssuer, cidrs ...authorizationv1alpha1.CIDR) authorizationv1alpha1.AllowRule {
	return authorizationv1alpha1.AllowRule{
		Workloads:    []authorizationv1alpha1.WorkloadMatcher{{JWT: &authorizationv1alpha1.JWTMatcher{Issuer: is.url}}},
		OnboardTo:    []authorizationv1alpha1.OnboardTarget{{}},
		AddressCIDRs: cidrs,
	}
}

// markConnected sets AgentConnected=True, as the xDS server does when the
// workload's sidecar connects.
func (h *onboarding) markConnected(name string) {
	h.t.Helper()
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(h.t.Context(), client.ObjectKey{Namespace: h.ns, Name: name}, war); err != nil {
		h.t.Fatal(err)
	}
	war.Status.Conditions = []metav1.Condition{{Type: runtimev1alpha1.ConditionAgentConnected, Status: metav1.ConditionTrue, Reason: runtimev1alpha1.ReasonAgentEstablishedConnection, LastTransitionTime: metav1.Now()}}
	if err := env.Client.Status().Update(h.t.Context(), war); err != nil {
		h.t.Fatal(err)
	}
	waitCached(h.t, war)
}

// workloadEntry reads the registration's WorkloadEntry from the API server.
func (h *onboarding) workloadEntry(ns, name string) (*istionetworkingv1.WorkloadEntry, error) {
	we := &istionetworkingv1.WorkloadEntry{}
	err := env.Client.Get(h.t.Context(), client.ObjectKey{Namespace: ns, Name: name}, we)
	return we, err
}

// waitCached waits until the shared cache holds obj at its resourceVersion.
func waitCached(t *testing.T, obj client.Object) {
	t.Helper()
	want := obj.GetResourceVersion()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got := obj.DeepCopyObject().(client.Object)
		if err := cached.Get(ctx, client.ObjectKeyFromObject(obj), got); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		g, _ := strconv.ParseUint(got.GetResourceVersion(), 10, 64)
		w, _ := strconv.ParseUint(want, 10, 64)
		return g >= w, nil
	})
	if err != nil {
		t.Fatalf("%T %s not in the cache: %v", obj, obj.GetName(), err)
	}
}

// sleep pauses between two polls.
func sleep(t *testing.T) {
	t.Helper()
	time.Sleep(20 * time.Millisecond)
}
