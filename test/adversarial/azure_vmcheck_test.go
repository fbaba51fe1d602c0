package adversarial

import (
	"testing"

	"google.golang.org/grpc/codes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/azure"
	"github.com/embark-mesh/embark/onboarding/identity/azure/azuretest"
)

// vmCheckWorld is an endpoint whose Azure verifier confirms every VM with
// a loopback Azure Resource Manager (identity.azure.vmCheck), which knows
// the victim VM (ratings-1, 10.1.0.4) and the attacker's VM (ratings-2,
// 10.1.0.5), both genuine VMs of the allowed subscription; rule is the
// only policy.
type vmCheckWorld struct {
	*azureWorld
	arm              *azuretest.ARM
	victim, attacker azuretest.VM
}

func newVMCheckWorld(t *testing.T, rule authorizationv1alpha1.AllowRule) *vmCheckWorld {
	t.Helper()
	m, err := azuretest.NewMicrosoft()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	arm := azuretest.NewARM()
	t.Cleanup(arm.Close)
	victim, attacker := azuretest.DefaultVM(), azuretest.DefaultVM()
	attacker.Name, attacker.PrincipalID, attacker.VMID, attacker.IP = "ratings-2", "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f", "2a3b4c5d-6e7f-4a8b-9c0d-1e2f3a4b5c6d", "10.1.0.5"
	arm.AddVM(victim)
	arm.AddVM(attacker)
	src, err := azure.NewTokenSource(azure.TokenSourceOptions{Getenv: func(string) string { return "" }, IMDSEndpoint: arm.URL()})
	if err != nil {
		t.Fatal(err)
	}
	checker, err := azure.NewChecker(azure.CheckerOptions{Token: src, ARMEndpoint: arm.URL()})
	if err != nil {
		t.Fatal(err)
	}
	v, err := azure.NewVerifier(azure.Config{Tenants: []string{victim.TenantID}, Audiences: []string{audience}, JWKSURL: m.JWKSURL(), CACertificates: m.CACertificates(),
		VMCheck: checker})
	if err != nil {
		t.Fatal(err)
	}
	w := &vmCheckWorld{azureWorld: &azureWorld{onboarding: newOnboarding(t, onboardingOptions{azure: v, detailed: true}), ms: m}, arm: arm, victim: victim, attacker: attacker}
	w.policy("azure-embark", rule)
	w.group("ratings")
	return w
}

// azureSubscriptionRule allows VMs of the default VM's subscription,
// addresses in cidrs.
func azureSubscriptionRule(cidrs ...authorizationv1alpha1.CIDR) authorizationv1alpha1.AllowRule {
	vm := azuretest.DefaultVM()
	return authorizationv1alpha1.AllowRule{
		Workloads: []authorizationv1alpha1.WorkloadMatcher{{Azure: &authorizationv1alpha1.AzureMatcher{
			Tenants: []string{vm.TenantID}, Subscriptions: []string{vm.SubscriptionID},
		}}},
		OnboardTo:    []authorizationv1alpha1.OnboardTarget{{}},
		AddressCIDRs: cidrs,
	}
}

// A genuine VM of the subscription (its token is valid) registers with the
// address of another VM (what it puts in the request, or what a tampered
// IMDS network answer says): with the VM check on, only the private address
// of its own primary network interface, as Resource Manager reports it, is
// proven; the rule lists no addressCIDRs, so the other host's address is
// refused and its own is accepted.
func TestAzureVMClaimsAnotherHostsAddress(t *testing.T) {
	Attack(t, "a valid Azure VM token is presented with the address of another host while the endpoint confirms VMs with Azure Resource Manager")
	w := newVMCheckWorld(t, azureSubscriptionRule())
	res, err := w.authorize(w.token(w.attacker, audience))
	if err != nil {
		t.Fatalf("the attacker's genuine token: %v", err)
	}
	_, err = w.register(res.GetToken(), "", w.victim.IP, "VPC")
	wantCode(t, "another host's address", err, codes.PermissionDenied, w.victim.IP, "not proven", "primary network interface address "+w.attacker.IP)
	assertNoRegistrations(t, w.ns)

	reg, err := w.register(res.GetToken(), "", w.attacker.IP, "VPC")
	if err != nil {
		t.Fatalf("the VM's own network interface address: %v", err)
	}
	we, err := w.workloadEntry(w.ns, reg.GetRegistrationName())
	if err != nil {
		t.Fatal(err)
	}
	if we.Spec.Address != w.attacker.IP {
		t.Errorf("WorkloadEntry address %s, want the network interface's %s", we.Spec.Address, w.attacker.IP)
	}
}

// A VM of the subscription registers another VM's address first, as the
// rule's addressCIDRs allow (an unproven address): the VM whose network
// interface holds the address must still onboard, its proven address
// fencing the squatter's registration, not be refused as a conflict.
func TestAzureVMSquatsAnotherVMsAddress(t *testing.T) {
	Attack(t, "an Azure VM registers another VM's address (allowed by addressCIDRs) first and keeps that VM from onboarding")
	w := newVMCheckWorld(t, azureSubscriptionRule("10.1.0.0/24"))
	res, err := w.authorize(w.token(w.attacker, audience))
	if err != nil {
		t.Fatal(err)
	}
	squat, err := w.register(res.GetToken(), "", w.victim.IP, "VPC")
	if err != nil {
		t.Fatalf("the squatter's registration of an address in addressCIDRs: %v", err)
	}
	squatEntry, err := w.workloadEntry(w.ns, squat.GetRegistrationName())
	if err != nil {
		t.Fatal(err)
	}
	waitCached(t, squatEntry)

	res, err = w.authorize(w.token(w.victim, audience))
	if err != nil {
		t.Fatalf("the victim's token: %v", err)
	}
	reg, err := w.register(res.GetToken(), "", w.victim.IP, "VPC")
	if err != nil {
		t.Fatalf("the VM owning %s onboards: %v, want its proven address to fence the squatter", w.victim.IP, err)
	}
	if _, err := w.workloadEntry(w.ns, squat.GetRegistrationName()); err == nil {
		t.Errorf("the squatter's WorkloadEntry %s still holds %s", squat.GetRegistrationName(), w.victim.IP)
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: w.ns, Name: reg.GetRegistrationName()}, war); err != nil {
		t.Fatal(err)
	}
	if id := war.Spec.Identity.Azure; id == nil || !id.VMConfirmed || id.Location != w.victim.Location || id.VMID != w.victim.VMID {
		t.Errorf("registration identity %+v, want the VM confirmed in %s with VM ID %s", id, w.victim.Location, w.victim.VMID)
	}
}

// Anyone with a VM in any subscription of the tenant holds a genuine token;
// each costs Resource Manager calls, rate limited for every caller. A VM no
// policy could admit (another subscription) must cost none; a VM a policy
// naming locations could admit once confirmed is confirmed, and refused
// when Resource Manager reports it elsewhere.
func TestAzureResourceManagerCalledForVMsNoPolicyAllows(t *testing.T) {
	Attack(t, "Azure Resource Manager called for a VM no policy could admit")
	rule := azureSubscriptionRule()
	rule.Workloads[0].Azure.Locations = []string{"northeurope"}
	w := newVMCheckWorld(t, rule)
	stranger := w.attacker
	stranger.SubscriptionID = "11111111-2222-3333-4444-555555555555"
	_, err := w.authorize(w.token(stranger, audience))
	wantCode(t, "another subscription", err, codes.PermissionDenied, "subscription 11111111-2222-3333-4444-555555555555 not in")
	if n := w.arm.Calls(); n != 0 {
		t.Errorf("%d Resource Manager calls for a VM no policy could admit, want 0", n)
	}
	_, err = w.authorize(w.token(w.victim, audience))
	wantCode(t, "a VM in another location", err, codes.PermissionDenied, "location westeurope not in [northeurope]")
	if n := w.arm.Calls(); n != 2 {
		t.Errorf("%d Resource Manager calls for a VM a rule naming locations could admit, want 2", n)
	}
	assertNoRegistrations(t, w.ns)
}
