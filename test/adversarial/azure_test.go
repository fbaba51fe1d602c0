package adversarial

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/azure"
	"github.com/embark-mesh/embark/onboarding/identity/azure/azuretest"
)

// azureWorld is an endpoint trusting a loopback Entra ID for the default
// VM's tenant, with a policy allowing VMs of its subscription (addresses in
// 10.1.0.0/24).
type azureWorld struct {
	*onboarding
	ms *azuretest.Microsoft
}

func newAzureWorld(t *testing.T) *azureWorld {
	t.Helper()
	m, err := azuretest.NewMicrosoft()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	vm := azuretest.DefaultVM()
	v, err := azure.NewVerifier(azure.Config{Tenants: []string{vm.TenantID}, Audiences: []string{audience}, JWKSURL: m.JWKSURL(), CACertificates: m.CACertificates()})
	if err != nil {
		t.Fatal(err)
	}
	w := &azureWorld{onboarding: newOnboarding(t, onboardingOptions{azure: v, detailed: true}), ms: m}
	w.policy("azure-embark", authorizationv1alpha1.AllowRule{
		Workloads: []authorizationv1alpha1.WorkloadMatcher{{Azure: &authorizationv1alpha1.AzureMatcher{
			Tenants: []string{vm.TenantID}, Subscriptions: []string{vm.SubscriptionID},
		}}},
		OnboardTo:    []authorizationv1alpha1.OnboardTarget{{}},
		AddressCIDRs: []authorizationv1alpha1.CIDR{"10.1.0.0/24"},
	})
	w.group("ratings")
	return w
}

func (w *azureWorld) sign(claims map[string]any) string {
	w.t.Helper()
	tok, err := w.ms.Sign(claims)
	if err != nil {
		w.t.Fatal(err)
	}
	return tok
}

func (w *azureWorld) token(vm azuretest.VM, aud string) string {
	return w.sign(vm.Claims(aud, time.Now().Add(-time.Second)))
}

func (w *azureWorld) authorize(tok string) (*onboardingv1alpha1.AuthorizeResponse, error) {
	return w.client.Authorize(w.t.Context(), &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: w.ns, Name: "ratings"},
		Credential:    &onboardingv1alpha1.AuthorizeRequest_Azure{Azure: &onboardingv1alpha1.AzureCredential{Token: tok}},
	})
}

// Anyone with a subscription in the tenant (or a VM in it) holds a
// genuine Microsoft-signed token: it must not onboard where the policy
// names another subscription; nor must a VM of another tenant, whose
// issuer the endpoint does not trust at all.
func TestAzureVMOfAnotherSubscriptionOnboards(t *testing.T) {
	Attack(t, "a genuine managed identity token of a VM in the attacker's own subscription or tenant onboards")
	w := newAzureWorld(t)
	attacker := azuretest.DefaultVM()
	attacker.SubscriptionID = "11111111-2222-3333-4444-555555555555"
	_, err := w.authorize(w.token(attacker, audience))
	wantCode(t, "another subscription", err, codes.PermissionDenied, "subscription 11111111-2222-3333-4444-555555555555 not in [0b1f6471-1bf0-4dda-aec3-cb9272f09590]")
	otherTenant := azuretest.DefaultVM()
	otherTenant.TenantID = "f8cdef31-a31e-4b4a-93e4-5f571e91255a"
	_, err = w.authorize(w.token(otherTenant, audience))
	wantCode(t, "another tenant", err, codes.Unauthenticated, "UnknownIssuer")
	assertNoRegistrations(t, w.ns)

	// The policy's own subscription onboards, under its deterministic name.
	res, err := w.authorize(w.token(azuretest.DefaultVM(), audience))
	if err != nil {
		t.Fatalf("VM of the subscription: %v", err)
	}
	if want := "ratings-azure-0b1f6471-1bf0-4dda-aec3-cb9272f09590-embark-rg-vm-ratings-1"; res.GetRegistrationName() != want {
		t.Errorf("registration name %q, want %q", res.GetRegistrationName(), want)
	}
}

// A token seen once (in a log, by a proxy, by a service it was also sent
// to) is presented again.
func TestAzureTokenReplayed(t *testing.T) {
	Attack(t, "a captured Azure managed identity token is presented a second time")
	w := newAzureWorld(t)
	tok := w.token(azuretest.DefaultVM(), audience)
	if _, err := w.authorize(tok); err != nil {
		t.Fatalf("first use: %v", err)
	}
	_, err := w.authorize(tok)
	wantCode(t, "replay", err, codes.Unauthenticated, "Replayed", "already used")
}

// The VM (or anything on it) asks IMDS for a token for another resource
// (Azure Resource Manager's, sent to every Azure API the VM calls); or a
// user-assigned identity, which any number of VMs (and other resources) may
// hold, presents its token: its xms_mirid names the identity, not a VM.
func TestAzureTokenNotMadeForOnboarding(t *testing.T) {
	Attack(t, "a Microsoft-signed token for another resource, or of a user-assigned identity, onboards as an Azure VM")
	w := newAzureWorld(t)
	vm := azuretest.DefaultVM()
	_, err := w.authorize(w.token(vm, "https://management.azure.com/"))
	wantCode(t, "Resource Manager's audience", err, codes.Unauthenticated, "WrongAudience")
	claims := vm.Claims(audience, time.Now().Add(-time.Second))
	claims["xms_mirid"] = "/subscriptions/" + vm.SubscriptionID + "/resourcegroups/embark-rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/shared"
	_, err = w.authorize(w.sign(claims))
	wantCode(t, "user-assigned identity", err, codes.Unauthenticated, "xms_mirid", "virtual machine")
	delete(claims, "xms_mirid")
	_, err = w.authorize(w.sign(claims))
	wantCode(t, "no xms_mirid", err, codes.Unauthenticated, "xms_mirid")
	assertNoRegistrations(t, w.ns)
}

// An Azure token proves no address: registering one outside the rule's
// addressCIDRs (another VM's address) is refused.
func TestAzureVMRegistersAnotherAddress(t *testing.T) {
	Attack(t, "an Azure VM registers an address its token does not prove and no addressCIDRs allows")
	w := newAzureWorld(t)
	res, err := w.authorize(w.token(azuretest.DefaultVM(), audience))
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.register(res.GetToken(), "", "10.200.0.9", "VPC")
	wantCode(t, "register", err, codes.PermissionDenied, "10.200.0.9", "not proven", "Azure VM")
	assertNoRegistrations(t, w.ns)
	if _, err := w.register(res.GetToken(), "", "10.1.0.4", "VPC"); err != nil {
		t.Fatalf("address in addressCIDRs: %v", err)
	}
}
