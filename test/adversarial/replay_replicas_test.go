package adversarial

import (
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
)

// A single-use proof (a signed sts:GetCallerIdentity request, a JWT with
// its jti) accepted by one endpoint replica is sent to another replica of
// the same deployment: the second replica must refuse it as a replay, and
// of the same fresh proof sent to both replicas at once exactly one must be
// accepted.
func TestReplayAcrossReplicas(t *testing.T) {
	Attack(t, "a signed STS request or a JWT used at one endpoint replica is accepted again by another replica")
	is := newJWTIssuer(t, "corp")
	a := newOnboarding(t, onboardingOptions{issuers: []*jwtIssuer{is}, profileCheck: true})
	b := newOnboarding(t, onboardingOptions{issuers: []*jwtIssuer{is}, profileCheck: true, peer: a})
	a.policy("any", anyEC2(), jwtRule(is, "0.0.0.0/0", "::/0"))
	a.group("ratings")
	vm := a.instance(awstest.Instance{InstanceID: "i-0aaaaaaaaaaaaaa31", PrivateIP: "10.0.3.1", Role: "ratings-role"})

	sts := &onboardingv1alpha1.AuthorizeRequest{Credential: a.awsCredential(vm, true)}
	if _, err := a.authorize("ratings", sts); err != nil {
		t.Fatalf("replica A refuses a fresh STS proof: %v", err)
	}
	_, err := b.authorize("ratings", sts)
	wantCode(t, "the STS proof used at replica A, sent to replica B", err, codes.Unauthenticated, "STSReplayed", "already used")

	raw := is.mint(t, "vm-31", nil)
	jwtCred := jwtRequest(raw)
	if _, err := a.authorize("ratings", jwtCred); err != nil {
		t.Fatalf("replica A refuses a fresh JWT: %v", err)
	}
	_, err = b.authorize("ratings", jwtCred)
	wantCode(t, "the JWT used at replica A, sent to replica B", err, codes.Unauthenticated, "Replayed", "already used")

	// The same fresh proofs at both replicas at once: one onboarding each.
	race := map[string]*onboardingv1alpha1.AuthorizeRequest{
		"STS proof": {Credential: a.awsCredential(vm, true)},
		"JWT":       jwtRequest(is.mint(t, "vm-32", nil)),
	}
	for what, cred := range race {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, h := range []*onboarding{a, b} {
			wg.Go(func() { _, errs[i] = h.authorize("ratings", cred) })
		}
		wg.Wait()
		accepted := 0
		for _, err := range errs {
			switch status.Code(err) {
			case codes.OK:
				accepted++
			case codes.Unauthenticated:
			default:
				t.Errorf("%s sent to both replicas at once: %v", what, err)
			}
		}
		if accepted != 1 {
			t.Errorf("%s sent to both replicas at once: accepted %d times (%v), want once", what, accepted, errs)
		}
	}
}

// jwtRequest is an AuthorizeRequest carrying the token raw.
func jwtRequest(raw string) *onboardingv1alpha1.AuthorizeRequest {
	return &onboardingv1alpha1.AuthorizeRequest{Credential: &onboardingv1alpha1.AuthorizeRequest_Jwt{Jwt: &onboardingv1alpha1.JWTCredential{Token: raw}}}
}

// authorize sends a copy of req, addressed to group, to the endpoint.
func (h *onboarding) authorize(group string, req *onboardingv1alpha1.AuthorizeRequest) (*onboardingv1alpha1.AuthorizeResponse, error) {
	req = proto.CloneOf(req)
	req.WorkloadGroup = &onboardingv1alpha1.WorkloadGroupRef{Namespace: h.ns, Name: group}
	return h.client.Authorize(h.t.Context(), req)
}
