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
	return newAzureWorldWith(t, onboardingOptions{})
}

// newAzureWorldWith is newAzureWorld with o's options (its Azure verifier
// and detailed denials are the world's own).
func newAzureWorldWith(t *testing.T, o onboardingOptions) *azureWorld {
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
	o.azure, o.detailed = v, true
	w := &azureWorld{onboarding: newOnboarding(t, o), ms: m}
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

// azureAgent is an Azure VM onboarded at the endpoint: the managed identity
// token it onboarded with (which Azure's metadata service hands it again
// for most of a day), its onboarding token and its session key.
type azureAgent struct {
	vm                  azuretest.VM
	imdsToken, onboard  string
	sessionKey, address string
}

// onboardVM onboards vm with a fresh token at address.
func (w *azureWorld) onboardVM(vm azuretest.VM, address string) azureAgent {
	w.t.Helper()
	a := azureAgent{vm: vm, imdsToken: w.token(vm, audience), address: address}
	res, err := w.authorize(a.imdsToken)
	if err != nil {
		w.t.Fatalf("onboard %s: authorize: %v", vm.Name, err)
	}
	reg, err := w.register(res.GetToken(), "", address, "VPC")
	if err != nil {
		w.t.Fatalf("onboard %s: register: %v", vm.Name, err)
	}
	a.onboard, a.sessionKey = res.GetToken(), reg.GetSessionKey()
	return a
}

// renew is the agent's renewal of its onboarding token: Authorize with
// imdsToken, carrying onboard and sessionKey in the request metadata.
func (w *azureWorld) renew(imdsToken, onboard, sessionKey string) (*onboardingv1alpha1.AuthorizeResponse, error) {
	return w.client.Authorize(w.call(onboard, sessionKey), &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: w.ns, Name: "ratings"},
		Credential:    &onboardingv1alpha1.AuthorizeRequest_Azure{Azure: &onboardingv1alpha1.AzureCredential{Token: imdsToken}},
	})
}

// assertAgentRenews checks that a, re-presenting its cached token with its
// own onboarding token and session, renews its onboarding token and that
// the renewed token renews its sidecar token: the refusals before it are
// about the attacker's request, not about every re-presented token.
func (w *azureWorld) assertAgentRenews(a azureAgent) {
	w.t.Helper()
	res, err := w.renew(a.imdsToken, a.onboard, a.sessionKey)
	if err != nil {
		w.t.Fatalf("the agent's own renewal with its cached token: %v", err)
	}
	if _, err := w.client.RenewSidecarToken(w.call(res.GetToken(), a.sessionKey), &onboardingv1alpha1.RenewSidecarTokenRequest{}); err != nil {
		w.t.Fatalf("sidecar token renewal with the renewed onboarding token: %v", err)
	}
}

func otherAzureVM() azuretest.VM {
	vm := azuretest.DefaultVM()
	vm.Name, vm.VMID, vm.PrincipalID, vm.IP = "reviews-1", "6d3e1f0a-8c2b-4a5d-9e7f-1b2c3d4e5f60", "2c4e6a8b-1d3f-4a5b-8c7d-9e0f1a2b3c4d", "10.1.0.5"
	return vm
}

// A VM's managed identity token, which Azure's metadata service hands out
// for most of a day, is captured (from a log, a proxy, a service it was
// also sent to) and presented again without the agent's session, or with
// the agent's onboarding token but no session key.
func TestAzureCachedTokenWithoutSession(t *testing.T) {
	Attack(t, "a VM's cached Azure managed identity token, captured, is re-presented without the agent's session")
	w := newAzureWorld(t)
	agent := w.onboardVM(azuretest.DefaultVM(), "10.1.0.4")
	_, err := w.authorize(agent.imdsToken)
	wantCode(t, "no onboarding token, no session", err, codes.Unauthenticated, "Replayed", "already used", "no onboarding token")
	_, err = w.renew(agent.imdsToken, agent.onboard, "")
	wantCode(t, "the agent's onboarding token, no session key", err, codes.Unauthenticated, "Replayed", "no session key")
	w.assertAgentRenews(agent)
}

// Another VM the policy allows (the attacker's own) holds a valid
// onboarding token and session of its own, and presents a captured token of
// the victim VM with them, to get an onboarding token for the victim.
func TestAzureCachedTokenWithAnotherVMsSession(t *testing.T) {
	Attack(t, "a captured Azure token of a VM is re-presented with the onboarding token and session of another VM")
	w := newAzureWorld(t)
	victim := w.onboardVM(azuretest.DefaultVM(), "10.1.0.4")
	attacker := w.onboardVM(otherAzureVM(), "10.1.0.5")
	_, err := w.renew(victim.imdsToken, attacker.onboard, attacker.sessionKey)
	wantCode(t, "the other VM's onboarding token and session", err, codes.Unauthenticated, "Replayed", "another workload's")
	_, err = w.renew(victim.imdsToken, attacker.onboard, victim.sessionKey)
	wantCode(t, "the other VM's onboarding token, the victim's session key", err, codes.Unauthenticated, "Replayed", "another workload's")
	w.assertAgentRenews(victim)
	w.assertAgentRenews(attacker)
}

// The victim's onboarding token leaked with its cached managed identity
// token, but not its session key (which the agent keeps in memory): the
// pair with any other session key is refused.
func TestAzureCachedTokenWithWrongSessionKey(t *testing.T) {
	Attack(t, "a captured Azure token is re-presented with the VM's own onboarding token but a session key that is not its registration's")
	w := newAzureWorld(t)
	victim := w.onboardVM(azuretest.DefaultVM(), "10.1.0.4")
	attacker := w.onboardVM(otherAzureVM(), "10.1.0.5")
	for name, key := range map[string]string{"a guessed key": "0123456789abcdef0123456789abcdef", "another VM's key": attacker.sessionKey} {
		_, err := w.renew(victim.imdsToken, victim.onboard, key)
		wantCode(t, name, err, codes.Unauthenticated, "Replayed", "another agent session")
	}
	w.assertAgentRenews(victim)
}
