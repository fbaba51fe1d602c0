package adversarial

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/gce"
	"github.com/embark-mesh/embark/onboarding/identity/gce/gcetest"
)

// gceWorld is an endpoint trusting a loopback Google, with a policy
// allowing instances of project embark-test (addresses in 10.128.0.0/20).
type gceWorld struct {
	*onboarding
	google *gcetest.Google
}

func newGCEWorld(t *testing.T) *gceWorld {
	t.Helper()
	g, err := gcetest.NewGoogle()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	v, err := gce.NewVerifier(gce.Config{Audiences: []string{audience}, JWKSURL: g.JWKSURL(), CACertificates: g.CACertificates()})
	if err != nil {
		t.Fatal(err)
	}
	w := &gceWorld{onboarding: newOnboarding(t, onboardingOptions{gce: v, detailed: true}), google: g}
	w.policy("gce-embark-test", authorizationv1alpha1.AllowRule{
		Workloads:    []authorizationv1alpha1.WorkloadMatcher{{GCP: &authorizationv1alpha1.GCPMatcher{Projects: []string{"embark-test"}}}},
		OnboardTo:    []authorizationv1alpha1.OnboardTarget{{}},
		AddressCIDRs: []authorizationv1alpha1.CIDR{"10.128.0.0/20"},
	})
	w.group("ratings")
	return w
}

func (w *gceWorld) token(in gcetest.Instance, aud string) string {
	w.t.Helper()
	tok, err := w.google.Token(in, aud, time.Now().Add(-time.Second))
	if err != nil {
		w.t.Fatal(err)
	}
	return tok
}

func (w *gceWorld) authorize(tok string) (*onboardingv1alpha1.AuthorizeResponse, error) {
	return w.client.Authorize(w.t.Context(), &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: w.ns, Name: "ratings"},
		Credential:    &onboardingv1alpha1.AuthorizeRequest_Gce{Gce: &onboardingv1alpha1.GCECredential{Token: tok}},
	})
}

// Anyone can create a GCP project and an instance in it: its token is
// genuinely Google's. It must not onboard where the policy names another
// project.
func TestGCEInstanceOfAnotherProjectOnboards(t *testing.T) {
	Attack(t, "a genuine GCE instance identity token of the attacker's own project onboards")
	w := newGCEWorld(t)
	attacker := gcetest.DefaultInstance()
	attacker.ProjectID, attacker.ProjectNumber = "attacker-project", 999999999999
	_, err := w.authorize(w.token(attacker, audience))
	wantCode(t, "authorize", err, codes.PermissionDenied, "project attacker-project not in [embark-test]")
	assertNoRegistrations(t, w.ns)

	// The policy's own project onboards, under its deterministic name.
	res, err := w.authorize(w.token(gcetest.DefaultInstance(), audience))
	if err != nil {
		t.Fatalf("instance of embark-test: %v", err)
	}
	if want := "ratings-gcp-embark-test-us-central1-a-gce-5180367924151823417"; res.GetRegistrationName() != want {
		t.Errorf("registration name %q, want %q", res.GetRegistrationName(), want)
	}
}

// A token seen once (in a log, by a proxy, by a compromised service it was
// also sent to) is presented again.
func TestGCETokenReplayed(t *testing.T) {
	Attack(t, "a captured GCE instance identity token is presented a second time")
	w := newGCEWorld(t)
	tok := w.token(gcetest.DefaultInstance(), audience)
	if _, err := w.authorize(tok); err != nil {
		t.Fatalf("first use: %v", err)
	}
	_, err := w.authorize(tok)
	wantCode(t, "replay", err, codes.Unauthenticated, "Replayed", "already used")
}

// The instance fetched a token for another service (any audience can be
// asked for), or a service account key holder minted a Google ID token for
// the instance's service account with no compute_engine claims.
func TestGCETokenNotMadeForOnboarding(t *testing.T) {
	Attack(t, "a Google-signed token for another audience, or without compute_engine claims, onboards as a GCE instance")
	w := newGCEWorld(t)
	_, err := w.authorize(w.token(gcetest.DefaultInstance(), "https://other-service.example.com"))
	wantCode(t, "another audience", err, codes.Unauthenticated, "WrongAudience")
	claims := gcetest.DefaultInstance().Claims(audience, time.Now().Add(-time.Second))
	delete(claims, "google")
	noInstance, err := w.google.Sign(claims)
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.authorize(noInstance)
	wantCode(t, "no compute_engine claims", err, codes.Unauthenticated, "google.compute_engine", "format=full")
	assertNoRegistrations(t, w.ns)
}

// A GCE token proves no address: registering one outside the rule's
// addressCIDRs (another VM's address) is refused.
func TestGCEInstanceRegistersAnotherAddress(t *testing.T) {
	Attack(t, "a GCE instance registers an address its token does not prove and no addressCIDRs allows")
	w := newGCEWorld(t)
	res, err := w.authorize(w.token(gcetest.DefaultInstance(), audience))
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.register(res.GetToken(), "", "10.200.0.9", "VPC")
	wantCode(t, "register", err, codes.PermissionDenied, "10.200.0.9", "not proven", "GCE instance")
	assertNoRegistrations(t, w.ns)
	if _, err := w.register(res.GetToken(), "", "10.128.0.7", "VPC"); err != nil {
		t.Fatalf("address in addressCIDRs: %v", err)
	}
}
