// Package endpoint implements the onboarding endpoint's gRPC API
// (OnboardingService): it verifies a workload's platform identity, checks the
// OnboardingPolicies, issues the onboarding token, and registers the workload
// through the registry. It is the only place that turns errors into gRPC
// status codes.
package endpoint

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity"
	awsidentity "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
	"github.com/embark-mesh/embark/onboarding/identity/aws/profile"
	azureidentity "github.com/embark-mesh/embark/onboarding/identity/azure"
	ecsidentity "github.com/embark-mesh/embark/onboarding/identity/ecs"
	gceidentity "github.com/embark-mesh/embark/onboarding/identity/gce"
	"github.com/embark-mesh/embark/onboarding/identity/replay"
	"github.com/embark-mesh/embark/onboarding/policy"
	"github.com/embark-mesh/embark/onboarding/token"
	"github.com/embark-mesh/embark/registry"
)

// AWSVerifier verifies AWS credentials (awsidentity.Verifier).
type AWSVerifier interface {
	Verify(ctx context.Context, cred awsidentity.Credential) (*identity.Identity, error)
}

// JWTVerifier verifies JWT credentials (jwt.Verifier).
type JWTVerifier interface {
	Verify(ctx context.Context, token string) (*identity.Identity, error)
}

// GCEVerifier verifies Compute Engine instance identity tokens
// (gce.Verifier): gate is asked before the Compute API is.
type GCEVerifier interface {
	VerifyGated(ctx context.Context, token string, gate gceidentity.Gate) (*identity.Identity, error)
}

// ECSVerifier verifies ECS task credentials (ecs.Verifier): gate is asked
// before the ECS API is.
type ECSVerifier interface {
	VerifyGated(ctx context.Context, cred awswire.ECSCredential, gate ecsidentity.Gate) (*identity.Identity, error)
}

// AzureGatedVerifier is an AzureVerifier that confirms VMs with Azure
// Resource Manager (azure.Verifier): gate is asked before Resource Manager
// is. An Options.Azure that implements it is always asked this way.
type AzureGatedVerifier interface {
	VerifyGated(ctx context.Context, token string, renewal func(*identity.Identity) error, gate azureidentity.Gate) (*identity.Identity, error)
}

// Authorizer checks OnboardingPolicies (policy.Authorizer).
type Authorizer interface {
	Authorize(ctx context.Context, namespace, group string, id runtimev1alpha1.WorkloadIdentity) (policy.Decision, error)
	// Precheck evaluates without recording an Event.
	Precheck(ctx context.Context, namespace, group string, id runtimev1alpha1.WorkloadIdentity) (policy.Decision, error)
	// AllowsAddress says whether a rule allowing id lists addr in its
	// addressCIDRs.
	AllowsAddress(ctx context.Context, namespace, group string, id runtimev1alpha1.WorkloadIdentity, addr netip.Addr) (bool, error)
}

// Registrar registers workloads and renews their sidecar tokens
// (registry.Registrar).
type Registrar interface {
	Enroll(ctx context.Context, e registry.Enrollment, policy registry.Policy) (*registry.Result, error)
	RenewSidecarToken(ctx context.Context, key types.NamespacedName) (*registry.SidecarToken, error)
	Unregister(ctx context.Context, key types.NamespacedName, id runtimev1alpha1.WorkloadIdentity, sessionKey string) (bool, error)
}

// TokenIssuer issues and verifies onboarding tokens (token.Issuer).
type TokenIssuer interface {
	Issue(req token.Request) (string, *token.Claims, error)
	Verify(raw string) (*token.Claims, error)
}

var (
	_ AWSVerifier        = (*awsidentity.Verifier)(nil)
	_ ECSVerifier        = (*ecsidentity.Verifier)(nil)
	_ GCEVerifier        = (*gceidentity.Verifier)(nil)
	_ AzureGatedVerifier = (*azureidentity.Verifier)(nil)
	_ Authorizer         = (*policy.Authorizer)(nil)
	_ Registrar          = (*registry.Registrar)(nil)
	_ TokenIssuer        = (*token.Issuer)(nil)

	_ onboardingv1alpha1.OnboardingServiceServer = (*Server)(nil)
)

// Options configures a Server. Every field documents its default.
type Options struct {
	// AWS verifies EC2 credentials. Default: AWS credentials are refused.
	AWS AWSVerifier
	// JWT verifies on-prem JWTs. Default: JWT credentials are refused.
	JWT JWTVerifier
	// GCE verifies Compute Engine instance identity tokens (gce.Verifier).
	// Default: GCE credentials are refused.
	GCE GCEVerifier
	// Azure verifies Azure VM managed identity tokens (azure.Verifier).
	// Default: Azure credentials are refused.
	Azure AzureVerifier
	// ECS verifies ECS task credentials (ecs.Verifier). Default: ECS
	// credentials are refused.
	ECS ECSVerifier
	// Authorizer checks policies. Required.
	Authorizer Authorizer
	// Tokens issues onboarding tokens. Required.
	Tokens TokenIssuer
	// Registrar registers workloads. Required.
	Registrar Registrar
	// Client reads WorkloadGroups (an informer cache) and deletes
	// registrations on Unregister. Required.
	Client client.Client
	// Bootstrap is what every sidecar is told.
	Bootstrap BootstrapSettings
	// PropagationDelay the agent waits after Unregister. Default 5s.
	PropagationDelay time.Duration
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// Metrics. Default: metrics are not recorded.
	Metrics *Metrics
	// Recorder records Events where operators look. Default: none.
	Recorder record.EventRecorder
	// WatchInterval is how often WatchRegistration looks at the
	// registration in Client (an informer cache: no API request). Default 1s.
	WatchInterval time.Duration
	// ServiceCIDRs are the cluster's Service address ranges; a workload
	// address inside one is refused with InvalidArgument. Default: none.
	ServiceCIDRs []netip.Prefix
	// Source configures the check of the workload address against the
	// connection's source address. Default: not checked (see SourceCheck).
	Source SourceCheck
	// VerifyLimit limits platform credential verifications (Authorize) per
	// source address. Default: DefaultVerifyLimit.
	VerifyLimit RateLimit
	// AllowLoopbackAddresses accepts loopback workload addresses: for demos
	// and tests that run their "VMs" on 127.0.0.0/8 only. Default false.
	AllowLoopbackAddresses bool
	// InstanceProfiles confirms with EC2 and IAM that the role an STS
	// proof shows is the role of the instance's current instance profile.
	// An STS proof alone shows only a session of that role named after the
	// instance, which anyone allowed to assume the role can create. Default
	// (nil): STS proofs are not used at all, neither sent to STS nor
	// counted: an EC2 identity carries no IAM role, so policies naming
	// iamRoleNames or requireSTSProof admit no EC2 instance, and an STS
	// proof takes over no registration.
	InstanceProfiles InstanceProfileChecker
	// DetailedDenialSources are the source address ranges whose callers
	// are told why onboarding was denied (the closest policy rules, a
	// WorkloadGroup that does not exist), as FailedPrecondition or
	// PermissionDenied with the explanation. Every other caller gets
	// GenericDenialFormat: PermissionDenied with a request ID only; the
	// explanation is in the log line of that request ID, in the Event on
	// the WorkloadGroup and in the denial metrics. Default: none.
	DetailedDenialSources []netip.Prefix
	// Namespaces are the only namespaces whose WorkloadGroups are served
	// (the configuration's workloadNamespaces: the informers watch only
	// these and RBAC grants only these). A request for another namespace
	// is refused FailedPrecondition naming it. Default: every namespace.
	Namespaces []string
}

// InstanceProfileChecker confirms an EC2 instance's instance profile
// (*profile.Checker satisfies it).
type InstanceProfileChecker interface {
	Confirm(ctx context.Context, account, region, instance, role string) error
}

var _ InstanceProfileChecker = (*profile.Checker)(nil)

// BootstrapSettings are the mesh settings every sidecar's bootstrap carries.
type BootstrapSettings struct {
	DiscoveryAddress string
	ClusterID        string
	TrustDomain      string
	// RootCertificates are the PEM roots sent to every sidecar; when nil,
	// RootCertFile is read instead.
	RootCertificates []byte
	// RootCertFile is a PEM file of roots, read for each bootstrap (a
	// rotated file is served at once; a file that cannot be read or holds
	// no certificate keeps the last good roots).
	RootCertFile string
}

// Server implements OnboardingService.
type Server struct {
	onboardingv1alpha1.UnimplementedOnboardingServiceServer
	opts    Options
	log     *slog.Logger
	roots   *rootCerts
	limiter *sourceLimiter
}

// NewServer returns a Server.
func NewServer(opts Options) (*Server, error) {
	if opts.Authorizer == nil || opts.Tokens == nil || opts.Registrar == nil || opts.Client == nil {
		return nil, errors.New("endpoint: Authorizer, Tokens, Registrar and Client are required")
	}
	if opts.PropagationDelay == 0 {
		opts.PropagationDelay = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.WatchInterval == 0 {
		opts.WatchInterval = time.Second
	}
	opts.VerifyLimit.setDefaults()
	return &Server{opts: opts, log: opts.Logger, roots: &rootCerts{fixed: opts.Bootstrap.RootCertificates, file: opts.Bootstrap.RootCertFile}, limiter: newSourceLimiter(opts.VerifyLimit)}, nil
}

// RegisterService adds the service to a gRPC server.
func (s *Server) RegisterService(g *grpc.Server) {
	onboardingv1alpha1.RegisterOnboardingServiceServer(g, s)
}

// Authorize implements OnboardingService.
func (s *Server) Authorize(ctx context.Context, req *onboardingv1alpha1.AuthorizeRequest) (*onboardingv1alpha1.AuthorizeResponse, error) {
	if err := ValidateAuthorizeRequest(req); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	ns, group := req.GetWorkloadGroup().GetNamespace(), req.GetWorkloadGroup().GetName()
	if err := s.served(ctx, "authorize", ns); err != nil {
		return nil, err
	}
	if !s.limiter.allow(ctx) {
		s.opts.Metrics.denied("authorize", "RateLimited")
		return nil, status.Error(codes.ResourceExhausted, "too many platform credential verifications from this source; retry later")
	}
	unconfirmable := s.unconfirmableSTS(req)
	id, err := s.verify(ctx, req, ns, group)
	if err != nil {
		if _, isStatus := status.FromError(err); isStatus {
			return nil, err // a policy denial found before STS was called
		}
		s.opts.Metrics.denied("authorize", reasonOf(err))
		if verifierUnavailable(err) {
			// Nothing was refused: STS could not be asked. The agent
			// retries with backoff.
			s.log.Warn("cannot verify platform credential", "group", ns+"/"+group, "error", err)
			return nil, status.Errorf(codes.Unavailable, "platform credential cannot be verified right now; retry later: %v", err)
		}
		s.log.Info("refused platform credential", "group", ns+"/"+group, "error", err)
		return nil, status.Errorf(codes.Unauthenticated, "platform credential refused: %v", err)
	}
	apiID := APIIdentity(id)
	if d, err := s.opts.Authorizer.Authorize(ctx, ns, group, apiID); err != nil {
		if unconfirmable && d.NeedsIAMRoleProof {
			s.log.Warn("an STS proof of an IAM role was not used: without identity.aws.instanceProfileCheck it does not show the session came from the instance, so policies naming iamRoleNames or requireSTSProof admit no EC2 instance",
				"group", ns+"/"+group, "identity", policy.DescribeIdentity(apiID))
		}
		return nil, s.authzStatus(ctx, err, "authorize")
	}
	if err := s.confirmProfile(ctx, id); err != nil {
		return nil, err
	}
	name := registry.Name(group, apiID)
	raw, claims, err := s.opts.Tokens.Issue(token.Request{
		Namespace:        ns,
		Name:             name,
		WorkloadGroup:    group,
		WorkloadIdentity: registry.IdentityName(apiID),
		Verified:         &apiID,
		ProvenAddress:    provenAddress(id),
		SessionHash:      requestSessionHash(ctx),
	})
	if err != nil {
		s.log.Error("issue onboarding token", "error", err)
		return nil, status.Error(codes.Unavailable, "cannot issue an onboarding token right now; try again")
	}
	s.log.Info("authorized workload", "group", ns+"/"+group, "registration", name, "method", id.Method)
	return &onboardingv1alpha1.AuthorizeResponse{
		Token:            raw,
		ExpiresAt:        timestamppb.New(claims.Expiry),
		Namespace:        ns,
		RegistrationName: name,
	}, nil
}

// verify checks the request's platform credential. A signed STS request is
// sent to STS only when what the instance identity document proves could be
// allowed by a policy (allowed already, or denied only for want of a proven
// IAM role): identities no policy allows never cost an STS call. A denial
// found that way is returned as a gRPC status.
func (s *Server) verify(ctx context.Context, req *onboardingv1alpha1.AuthorizeRequest, ns, group string) (*identity.Identity, error) {
	switch c := req.GetCredential().(type) {
	case *onboardingv1alpha1.AuthorizeRequest_Aws:
		if s.opts.AWS == nil {
			return nil, errors.New("this endpoint does not accept AWS credentials")
		}
		cred := awswire.FromProto(c.Aws)
		if s.opts.InstanceProfiles == nil {
			cred.STS = nil // see unconfirmableSTS
		}
		if cred.STS == nil {
			return s.opts.AWS.Verify(ctx, cred)
		}
		docOnly := cred
		docOnly.STS = nil
		docID, err := s.opts.AWS.Verify(ctx, docOnly)
		if err != nil {
			return nil, err
		}
		d, err := s.opts.Authorizer.Precheck(ctx, ns, group, APIIdentity(docID))
		if err != nil {
			return nil, s.authzStatus(ctx, err, "authorize")
		}
		if !d.Allowed && !d.NeedsIAMRoleProof {
			// Record the denial as Authorize does; STS is not called.
			_, err := s.opts.Authorizer.Authorize(ctx, ns, group, APIIdentity(docID))
			if err == nil {
				err = &policy.DeniedError{Decision: d}
			}
			return nil, s.authzStatus(ctx, err, "authorize")
		}
		return s.opts.AWS.Verify(ctx, cred)
	case *onboardingv1alpha1.AuthorizeRequest_Jwt:
		if s.opts.JWT == nil {
			return nil, errors.New("this endpoint trusts no JWT issuer")
		}
		return s.opts.JWT.Verify(ctx, c.Jwt.GetToken())
	case *onboardingv1alpha1.AuthorizeRequest_Gce:
		if s.opts.GCE == nil {
			return nil, errors.New("this endpoint does not accept GCE credentials (identity.gce is not configured)")
		}
		return s.opts.GCE.VerifyGated(ctx, c.Gce.GetToken(), func(ctx context.Context, claimed *identity.Identity) error {
			return s.precheck(ctx, ns, group, claimed)
		})
	case *onboardingv1alpha1.AuthorizeRequest_Azure:
		if s.opts.Azure == nil {
			return nil, errors.New("this endpoint does not accept Azure credentials (identity.azure is not configured)")
		}
		if g, ok := s.opts.Azure.(AzureGatedVerifier); ok {
			return g.VerifyGated(ctx, c.Azure.GetToken(), s.azureRenewal(ctx, ns, group), func(ctx context.Context, claimed *identity.Identity) error {
				return s.precheckUnconfirmed(ctx, ns, group, claimed)
			})
		}
		return s.opts.Azure.VerifyRenewal(ctx, c.Azure.GetToken(), s.azureRenewal(ctx, ns, group))
	case *onboardingv1alpha1.AuthorizeRequest_Ecs:
		if s.opts.ECS == nil {
			return nil, errors.New("this endpoint does not accept ECS credentials (identity.ecs is not configured)")
		}
		return s.opts.ECS.VerifyGated(ctx, awswire.ECSFromProto(c.Ecs), func(ctx context.Context, claimed *identity.Identity) error {
			return s.precheck(ctx, ns, group, claimed)
		})
	default:
		return nil, errors.New("no credential")
	}
}

// precheck refuses, as a gRPC status, an identity that no policy allows as
// it is (recording the denial as Authorize does); the ECS task check asks it
// with the task's claims before it asks the ECS API, the GCE instance check
// with the token's identity before it asks the Compute API.
func (s *Server) precheck(ctx context.Context, ns, group string, id *identity.Identity) error {
	d, err := s.opts.Authorizer.Precheck(ctx, ns, group, APIIdentity(id))
	if err != nil {
		return s.authzStatus(ctx, err, "authorize")
	}
	if d.Allowed {
		return nil
	}
	if _, err = s.opts.Authorizer.Authorize(ctx, ns, group, APIIdentity(id)); err == nil {
		err = &policy.DeniedError{Decision: d}
	}
	return s.authzStatus(ctx, err, "authorize")
}

// precheckUnconfirmed is precheck for an identity its platform's API has
// not confirmed yet (an Azure VM before Resource Manager is asked): it
// passes an identity some policy allows as it is, or would allow once
// confirmed (Decision.NeedsConfirmation: a rule naming locations), and
// refuses the others, so that no API call is made for them.
func (s *Server) precheckUnconfirmed(ctx context.Context, ns, group string, id *identity.Identity) error {
	d, err := s.opts.Authorizer.Precheck(ctx, ns, group, APIIdentity(id))
	if err != nil {
		return s.authzStatus(ctx, err, "authorize")
	}
	if d.Allowed || d.NeedsConfirmation {
		return nil
	}
	if _, err = s.opts.Authorizer.Authorize(ctx, ns, group, APIIdentity(id)); err == nil {
		err = &policy.DeniedError{Decision: d}
	}
	return s.authzStatus(ctx, err, "authorize")
}

// unconfirmableSTS reports whether req carries an STS proof that the
// endpoint does not use because no instance profile check is configured:
// a role session named after an instance proves nothing about the
// instance unless EC2 and IAM confirm its role is the instance profile's
// (confirmProfile). Such a proof is never sent to STS, and the identity is
// the instance identity document's alone.
func (s *Server) unconfirmableSTS(req *onboardingv1alpha1.AuthorizeRequest) bool {
	return s.opts.InstanceProfiles == nil && req.GetAws().GetStsGetCallerIdentity() != nil
}

// Register implements OnboardingService. The registry applies the
// registration rules (registry.Registrar.Enroll); the endpoint checks the
// request's shape and the connection's source, and maps the registry's
// errors to codes (registerStatus).
func (s *Server) Register(ctx context.Context, req *onboardingv1alpha1.RegisterRequest) (*onboardingv1alpha1.RegisterResponse, error) {
	claims, err := s.session(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkBinding(ctx, claims); err != nil {
		s.opts.Metrics.denied("register", "SessionBinding")
		return nil, status.Errorf(codes.Unauthenticated, "onboarding token refused: %v (metadata %s): authorize again", err, SessionKeyMetadata)
	}
	if err := ValidateRegisterRequest(req); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	ns, groupName, _ := strings.Cut(claims.Workload.WorkloadGroup, "/")
	regInfo := reportedRegistration(req)
	if err := s.normalizeAddresses(&regInfo); err != nil {
		return nil, err
	}
	addr, _ := registry.WorkloadAddress(regInfo) // "" when invalid: Enroll says why
	if a, err := netip.ParseAddr(addr); err == nil {
		if err := s.checkSource(ctx, a); err != nil {
			return nil, err
		}
	}
	key := sessionKey(ctx)
	if key == "" {
		if key, err = newSessionKey(); err != nil {
			return nil, status.Error(codes.Unavailable, "cannot create a session key right now; try again")
		}
	}
	res, err := s.opts.Registrar.Enroll(ctx, registry.Enrollment{
		Namespace: ns, Group: groupName, Identity: *claims.Workload.Verified, ProvenAddress: claims.Workload.ProvenAddress,
		Registration: regInfo, SessionHash: registry.SessionHash(key), AgentError: agentErrorOf(req),
	}, policyCheck{s.opts.Authorizer})
	if err != nil {
		if errors.Is(err, registry.ErrSessionMismatch) {
			s.reportTakeoverRefused(ctx, claims, addr, err)
		}
		return nil, s.registerStatus(ctx, err, "register")
	}
	boot, err := s.bootstrap(res)
	if err != nil {
		s.log.Error("build sidecar bootstrap", "registration", res.Registration.Name, "error", err)
		return nil, status.Errorf(codes.Internal, "build sidecar bootstrap: %v", err)
	}
	s.opts.Metrics.registered(res.Created)
	return &onboardingv1alpha1.RegisterResponse{
		Namespace:        res.Registration.Namespace,
		RegistrationName: res.Registration.Name,
		RegistrationUid:  string(res.Registration.UID),
		Bootstrap:        boot,
		SessionKey:       key,
	}, nil
}

// policyCheck is the endpoint's Authorizer as the registry asks it.
type policyCheck struct{ authz Authorizer }

var _ registry.Policy = policyCheck{}

func (p policyCheck) Allow(ctx context.Context, namespace, group string, id runtimev1alpha1.WorkloadIdentity) error {
	_, err := p.authz.Authorize(ctx, namespace, group, id)
	return err
}

func (p policyCheck) AllowsAddress(ctx context.Context, namespace, group string, id runtimev1alpha1.WorkloadIdentity, addr netip.Addr) (bool, error) {
	return p.authz.AllowsAddress(ctx, namespace, group, id, addr)
}

// Unregister implements OnboardingService.
func (s *Server) Unregister(ctx context.Context, _ *onboardingv1alpha1.UnregisterRequest) (*onboardingv1alpha1.UnregisterResponse, error) {
	claims, err := s.session(ctx)
	if err != nil {
		return nil, err
	}
	ns, name, _ := strings.Cut(claims.Subject, "/")
	deleted, err := s.opts.Registrar.Unregister(ctx, types.NamespacedName{Namespace: ns, Name: name}, *claims.Workload.Verified, sessionKey(ctx))
	if err != nil {
		return nil, s.registerStatus(ctx, err, "unregister")
	}
	if !deleted {
		return &onboardingv1alpha1.UnregisterResponse{PropagationDelay: durationpb.New(0)}, nil
	}
	return &onboardingv1alpha1.UnregisterResponse{PropagationDelay: durationpb.New(s.opts.PropagationDelay)}, nil
}

// RenewSidecarToken implements OnboardingService.
func (s *Server) RenewSidecarToken(ctx context.Context, _ *onboardingv1alpha1.RenewSidecarTokenRequest) (*onboardingv1alpha1.RenewSidecarTokenResponse, error) {
	claims, err := s.session(ctx)
	if err != nil {
		return nil, err
	}
	key := types.NamespacedName{Namespace: claims.Namespace(), Name: claims.Name()}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := s.opts.Client.Get(ctx, key, war); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, status.Errorf(codes.NotFound, "registration %s does not exist: register again", key)
		}
		return nil, status.Errorf(codes.Unavailable, "read registration %s: %v", key, err)
	}
	if !war.DeletionTimestamp.IsZero() {
		return nil, status.Errorf(codes.NotFound, "registration %s is being deleted: register again", key)
	}
	if err := registry.CheckHolder(war, *claims.Workload.Verified, sessionKey(ctx)); err != nil {
		return nil, s.registerStatus(ctx, err, "renew")
	}
	// The policy may have changed since the workload registered.
	ns, groupName, _ := strings.Cut(claims.Workload.WorkloadGroup, "/")
	if _, err := s.opts.Authorizer.Authorize(ctx, ns, groupName, war.Spec.Identity); err != nil {
		return nil, s.authzStatus(ctx, err, "renew")
	}
	tok, err := s.opts.Registrar.RenewSidecarToken(ctx, key)
	if err != nil {
		return nil, s.registerStatus(ctx, err, "renew")
	}
	res := &onboardingv1alpha1.RenewSidecarTokenResponse{SidecarToken: tok.Token, ExpiresAt: timestamppb.New(tok.ExpiresAt)}
	// The current roots go with every renewal, so that a VM installs a
	// rotated serving CA without onboarding again. Roots that cannot be read
	// (and were never read) do not fail the renewal: the VM keeps its own.
	if roots, err := s.roots.get(); err == nil {
		res.RootCertificates = roots
	} else {
		s.log.Warn("root certificates not sent with the sidecar token renewal", "registration", key.String(), "error", err.Error())
	}
	return res, nil
}

// ReasonTakeoverRefused is the reason of the Warning Event recorded on a
// registration when another agent session's Register for it is refused.
const ReasonTakeoverRefused = "TakeoverRefused"

// reportTakeoverRefused logs and records (as an Event on the registration)
// a Register refused because the registration is bound to another agent
// session and the identity carries no fresh proof.
func (s *Server) reportTakeoverRefused(ctx context.Context, claims *token.Claims, addr string, err error) {
	s.opts.Metrics.denied("register", "SessionMismatch")
	s.log.Warn("refused to hand a registration to another agent session", "registration", claims.Subject, "address", addr, "error", err)
	if s.opts.Recorder == nil {
		return
	}
	cur := &runtimev1alpha1.WorkloadAutoRegistration{}
	if s.opts.Client.Get(ctx, client.ObjectKey{Namespace: claims.Namespace(), Name: claims.Name()}, cur) == nil {
		s.opts.Recorder.Eventf(cur, corev1.EventTypeWarning, ReasonTakeoverRefused, "refused a registration from another agent session (workload address %s) without an STS proof", addr)
	}
}

// session verifies the onboarding token in the request's metadata.
func (s *Server) session(ctx context.Context) (*token.Claims, error) {
	raw, err := bearer(ctx)
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	claims, err := s.opts.Tokens.Verify(raw)
	if err != nil {
		s.opts.Metrics.denied("token", reasonOf(err))
		return nil, status.Errorf(codes.Unauthenticated, "onboarding token refused: %v", err)
	}
	if claims.Workload.Verified == nil || !strings.Contains(claims.Workload.WorkloadGroup, "/") {
		return nil, status.Error(codes.Unauthenticated, "onboarding token refused: it names no verified workload")
	}
	// A namespace removed from the configuration since the token was issued.
	ns, _, _ := strings.Cut(claims.Workload.WorkloadGroup, "/")
	if err := s.served(ctx, "token", ns); err != nil {
		return nil, err
	}
	return claims, nil
}

// confirmProfile checks that the IAM role an STS proof showed is the role
// of the instance's current instance profile: the STS proof alone shows
// only a session of that role named after the instance, which anyone
// allowed to assume the role can create. It runs after the policies
// allowed the identity, so no EC2 or IAM call is made for an identity no
// policy admits. Without a checker no identity is STS-proven (verify drops
// the proof), so there is nothing to confirm.
func (s *Server) confirmProfile(ctx context.Context, id *identity.Identity) error {
	if s.opts.InstanceProfiles == nil || id.AWS == nil || !id.AWS.STSProven {
		return nil
	}
	a := id.AWS
	err := s.opts.InstanceProfiles.Confirm(ctx, a.Account, a.Region, a.InstanceID, a.IAMRole)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, profile.ErrNoProfile):
		s.opts.Metrics.denied("authorize", "NoInstanceProfile")
		s.log.Info("refused an STS proof: the instance has no instance profile", "instance", a.InstanceID, "role", a.IAMRole, "error", err)
		return status.Errorf(codes.PermissionDenied, "instance %s has no instance profile associated: its STS proof of role %s did not come from it", a.InstanceID, a.IAMRole)
	case errors.Is(err, profile.ErrRoleNotInProfile):
		s.opts.Metrics.denied("authorize", "InstanceProfileMismatch")
		s.log.Info("refused an STS proof: the role is not the instance profile's", "instance", a.InstanceID, "role", a.IAMRole, "error", err)
		return status.Errorf(codes.PermissionDenied, "instance %s's instance profile does not carry role %s: its STS proof did not come from the instance", a.InstanceID, a.IAMRole)
	case errors.Is(err, profile.ErrRateLimited):
		s.opts.Metrics.denied("authorize", "InstanceProfileCheckRateLimited")
		return status.Error(codes.Unavailable, "instance profile checks over their rate limit; retry later")
	default:
		s.opts.Metrics.denied("authorize", "InstanceProfileCheckUnavailable")
		s.log.Warn("instance profile check failed", "instance", a.InstanceID, "error", err)
		return status.Errorf(codes.Unavailable, "could not confirm instance %s's instance profile with EC2/IAM; retry later", a.InstanceID)
	}
}

// served refuses a namespace outside Options.Namespaces: this endpoint
// neither watches nor may write there, so the request could only fail
// later, or wait on a cache that will never hold it. The refusal is a
// denial (deny): the generic answer, unless the source may see details,
// so that nobody learns the configured namespaces from it.
func (s *Server) served(ctx context.Context, stage, ns string) error {
	if len(s.opts.Namespaces) == 0 || slices.Contains(s.opts.Namespaces, ns) {
		return nil
	}
	return s.deny(ctx, denial{stage: stage, reason: "NamespaceNotServed", code: codes.FailedPrecondition,
		detail: fmt.Sprintf("namespace %q is not one of this onboarding endpoint's workload namespaces (workloadNamespaces: %s); ask the platform team to add it",
			ns, strings.Join(s.opts.Namespaces, ", "))})
}

// bearer returns the token of the `authorization: Bearer` metadata.
func bearer(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) != 1 {
		return "", errors.New("missing onboarding token: send `authorization: Bearer <token>` from Authorize")
	}
	scheme, tok, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return "", errors.New("malformed authorization metadata: want `Bearer <token>`")
	}
	return tok, nil
}

// authzStatus maps a policy error to a gRPC status. A denial and a missing
// WorkloadGroup get the same answer (see deny).
func (s *Server) authzStatus(ctx context.Context, err error, stage string) error {
	var denied *policy.DeniedError
	switch {
	case errors.Is(err, policy.ErrWorkloadGroupNotFound):
		return s.deny(ctx, denial{stage: stage, reason: "WorkloadGroupNotFound", detail: err.Error(), code: codes.FailedPrecondition})
	case errors.As(err, &denied):
		return s.deny(ctx, denial{stage: stage, reason: "PolicyDenied", detail: denied.Error(), code: codes.PermissionDenied})
	default:
		s.log.Error("authorize", "stage", stage, "error", err)
		return status.Errorf(codes.Unavailable, "cannot check OnboardingPolicies right now: %v", err)
	}
}

// registerStatus maps a registry error of the stage op (register, renew,
// unregister) to a gRPC status: the one place the registry's rules become
// codes.
func (s *Server) registerStatus(ctx context.Context, err error, op string) error {
	var refused *registry.PolicyError
	switch {
	case errors.As(err, &refused):
		return s.authzStatus(ctx, refused.Err, op)
	case errors.Is(err, registry.ErrWorkloadGroupNotFound):
		return s.deny(ctx, denial{stage: op, reason: "WorkloadGroupNotFound", detail: err.Error(), code: codes.FailedPrecondition})
	case errors.Is(err, registry.ErrInvalidRegistration):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, registry.ErrAddressNotProven):
		s.opts.Metrics.denied(op, "AddressNotProven")
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, registry.ErrIdentityConflict), errors.Is(err, registry.ErrAddressConflict), errors.Is(err, registry.ErrServiceAccountMissing):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, registry.ErrSessionMismatch):
		return status.Errorf(codes.PermissionDenied, "%v: an instance identity document alone cannot take it over; present an STS proof of the instance profile's role (used only with the endpoint's instance profile check) or send the session key of the agent that registered it", err)
	case errors.Is(err, registry.ErrWrongSession):
		return status.Errorf(codes.PermissionDenied, "%v (metadata %s missing or wrong): register again", err, SessionKeyMetadata)
	case errors.Is(err, registry.ErrOtherWorkload):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, registry.ErrRegistrationNotFound):
		return status.Errorf(codes.NotFound, "%v", err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	default:
		what := map[string]string{"register": "register workload", "renew": "renew sidecar token"}[op]
		if what == "" {
			what = op
		}
		s.log.Error(what, "error", err)
		return status.Errorf(codes.Unavailable, "%s: %v", what, err)
	}
}

// verifierUnavailable reports whether a verification failed because STS (or
// the ECS API, the Compute API), which vouches for the credential, could not answer (unreachable,
// throttling or failing), or the deployment's record of used credentials
// could not be read or written, as opposed to refusing it. KeySetUnavailable
// stays a refusal: it also stands for a JWKS the endpoint will not accept (a
// redirect to another origin, a discovery document naming another issuer).
func verifierUnavailable(err error) bool {
	return errors.Is(err, identity.ReasonSTSUnavailable) || errors.Is(err, identity.ReasonTaskCheckUnavailable) ||
		errors.Is(err, identity.ReasonInstanceCheckUnavailable) || errors.Is(err, identity.ReasonVMCheckUnavailable) ||
		errors.Is(err, replay.ErrUnavailable)
}

// reasonOf names an error's refusal reason for metrics.
func reasonOf(err error) string {
	if r := identity.ReasonOf(err); r != "" {
		return string(r)
	}
	var te *token.Error
	if errors.As(err, &te) {
		return string(te.Reason)
	}
	return "Other"
}

func reportedRegistration(req *onboardingv1alpha1.RegisterRequest) runtimev1alpha1.Registration {
	reg := runtimev1alpha1.Registration{
		Agent:    runtimev1alpha1.AgentInfo{Version: req.GetAgentVersion()},
		Settings: runtimev1alpha1.Settings{ConnectedOver: runtimev1alpha1.AddressType(req.GetConnectedOver())},
		Sidecar:  runtimev1alpha1.SidecarInfo{Istio: runtimev1alpha1.IstioSidecarInfo{Version: req.GetIstioSidecarVersion()}},
		Workload: runtimev1alpha1.WorkloadInfo{Labels: req.GetLabels()},
	}
	if reg.Settings.ConnectedOver == "" {
		reg.Settings.ConnectedOver = runtimev1alpha1.AddressTypeVPC
	}
	for _, a := range req.GetAddresses() {
		reg.Host.Addresses = append(reg.Host.Addresses, runtimev1alpha1.HostAddress{IP: a.GetIp(), Type: runtimev1alpha1.AddressType(a.GetType())})
	}
	return reg
}

// agentErrorOf is the agent's reported last onboarding error as the
// registration's status holds it; nil when it reported none.
func agentErrorOf(req *onboardingv1alpha1.RegisterRequest) *runtimev1alpha1.AgentError {
	e := req.GetLastError()
	if e == nil {
		return nil
	}
	return &runtimev1alpha1.AgentError{Reason: e.GetReason(), Message: e.GetMessage()}
}

// provenAddress is the address a verified identity proves, in canonical form:
// an EC2 document's signed privateIp, the ENI address of an ECS task the
// ECS API confirmed, the nic0 address of a GCE instance the Compute API
// confirmed, or the primary network interface address of an Azure VM Azure
// Resource Manager confirmed. JWT identities prove none, nor do unconfirmed
// GCE instances and Azure VMs (neither a GCE instance identity token nor an
// Azure managed identity token carries an address).
func provenAddress(id *identity.Identity) string {
	var addr string
	switch {
	case id.AWS != nil:
		addr = id.AWS.PrivateIP
	case id.ECS != nil && id.ECS.TaskConfirmed:
		addr = id.ECS.Address
	case id.GCE != nil && id.GCE.InstanceConfirmed:
		addr = id.GCE.Address
	case id.Azure != nil && id.Azure.VMConfirmed:
		addr = id.Azure.Address
	default:
		return ""
	}
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return ""
	}
	return ip.Unmap().String()
}

// APIIdentity converts a verified identity to the form registrations and
// policies use.
func APIIdentity(id *identity.Identity) runtimev1alpha1.WorkloadIdentity {
	switch {
	case id.AWS != nil:
		a := &runtimev1alpha1.AWSIdentity{Partition: id.AWS.Partition, Account: id.AWS.Account, Region: id.AWS.Region, Zone: id.AWS.Zone}
		if id.AWS.InstanceID != "" {
			a.EC2 = &runtimev1alpha1.EC2Identity{InstanceID: id.AWS.InstanceID}
			if id.AWS.STSProven {
				a.EC2.IAMRole = id.AWS.IAMRole
			}
		}
		return runtimev1alpha1.WorkloadIdentity{AWS: a}
	case id.JWT != nil:
		return runtimev1alpha1.WorkloadIdentity{JWT: &runtimev1alpha1.JWTIdentity{
			Issuer: id.JWT.Issuer, ShortName: id.JWT.ShortName, Subject: id.JWT.Subject, Attributes: id.JWT.Attributes,
		}}
	case id.GCE != nil:
		g := id.GCE
		return runtimev1alpha1.WorkloadIdentity{GCP: &runtimev1alpha1.GCPIdentity{
			ProjectID: g.ProjectID, ProjectNumber: g.ProjectNumber, Zone: g.Zone,
			InstanceID: g.InstanceID, InstanceName: g.InstanceName, ServiceAccount: g.ServiceAccount,
			InstanceConfirmed: g.InstanceConfirmed,
		}}
	case id.Azure != nil:
		a := id.Azure
		return runtimev1alpha1.WorkloadIdentity{Azure: &runtimev1alpha1.AzureIdentity{
			TenantID: a.TenantID, SubscriptionID: a.SubscriptionID, ResourceGroup: a.ResourceGroup,
			VMName: a.VMName, PrincipalID: a.PrincipalID, Location: a.Location, VMID: a.VMID, VMConfirmed: a.VMConfirmed,
		}}
	case id.ECS != nil:
		e := id.ECS
		return runtimev1alpha1.WorkloadIdentity{ECS: &runtimev1alpha1.ECSIdentity{
			Partition: e.Partition, Account: e.Account, Region: e.Region, Zone: e.Zone, Cluster: e.Cluster,
			TaskARN: e.TaskARN, TaskID: e.TaskID, TaskRole: e.TaskRole, Family: e.Family, Revision: e.Revision,
			TaskConfirmed: e.TaskConfirmed,
		}}
	default:
		return runtimev1alpha1.WorkloadIdentity{}
	}
}
