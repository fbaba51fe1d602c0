package adversarial

import (
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/endpoint"
	"github.com/embark-mesh/embark/onboarding/identity/azure/azuretest"
)

// The agent chooses its session key before it first onboards and sends it
// on every Authorize: the onboarding token it gets is bound to that key.
// When its registration is deleted, the agent onboards again with the
// managed identity token Azure's metadata service still hands it, its
// onboarding token and its session key. These attacks check that nothing
// else passes for that agent once the registration is gone.

// onboardSession onboards vm with a fresh token at address, as an agent
// whose session key is key: Authorize and Register carry it.
func (w *azureWorld) onboardSession(vm azuretest.VM, address, key string) azureAgent {
	w.t.Helper()
	a := azureAgent{vm: vm, imdsToken: w.token(vm, audience), address: address, sessionKey: key}
	ctx := metadata.AppendToOutgoingContext(w.t.Context(), endpoint.SessionKeyMetadata, key)
	res, err := w.client.Authorize(ctx, &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: w.ns, Name: "ratings"},
		Credential:    &onboardingv1alpha1.AuthorizeRequest_Azure{Azure: &onboardingv1alpha1.AzureCredential{Token: a.imdsToken}},
	})
	if err != nil {
		w.t.Fatalf("onboard %s: authorize: %v", vm.Name, err)
	}
	reg, err := w.register(res.GetToken(), key, address, "VPC")
	if err != nil {
		w.t.Fatalf("onboard %s: register: %v", vm.Name, err)
	}
	if reg.GetSessionKey() != key {
		w.t.Fatalf("onboard %s: the registration took session key %q, want the agent's %q", vm.Name, reg.GetSessionKey(), key)
	}
	a.onboard = res.GetToken()
	return a
}

// deleteRegistration deletes a's registration (kubectl delete war) and
// waits until the endpoint's cache no longer has it nor, removed by the
// garbage collector, its WorkloadEntry (the registry refuses to create a
// registration's WorkloadEntry over an earlier one of the same name; the
// agent retries until the collector removed it).
func (w *azureWorld) deleteRegistration(a azureAgent) {
	w.t.Helper()
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(w.t.Context(), client.ObjectKey{Namespace: w.ns, Name: azureRegistrationName(a.vm)}, war); err != nil {
		w.t.Fatal(err)
	}
	if err := env.Client.Delete(w.t.Context(), war); err != nil {
		w.t.Fatal(err)
	}
	waitGone(w.t, war)
	waitGone(w.t, &istionetworkingv1.WorkloadEntry{ObjectMeta: metav1.ObjectMeta{Namespace: war.Namespace, Name: war.Name}})
}

func azureRegistrationName(vm azuretest.VM) string {
	return "ratings-azure-" + vm.SubscriptionID + "-embark-rg-vm-" + vm.Name
}

// assertAgentOnboardsAgain checks that a, its registration deleted,
// onboards again with its cached token, its onboarding token and its
// session key: a new registration bound to the same session.
func (w *azureWorld) assertAgentOnboardsAgain(a azureAgent) {
	w.t.Helper()
	res, err := w.renew(a.imdsToken, a.onboard, a.sessionKey)
	if err != nil {
		w.t.Fatalf("the agent's own onboarding after its registration was deleted: %v", err)
	}
	reg, err := w.register(res.GetToken(), a.sessionKey, a.address, "VPC")
	if err != nil {
		w.t.Fatalf("register again after the registration was deleted: %v", err)
	}
	if reg.GetRegistrationName() != azureRegistrationName(a.vm) || reg.GetSessionKey() != a.sessionKey {
		w.t.Errorf("registered %s with session key %q, want %s with the agent's", reg.GetRegistrationName(), reg.GetSessionKey(), azureRegistrationName(a.vm))
	}
}

// The victim's registration is deleted; another VM the policy allows (the
// attacker's) presents the victim's captured cached token with its own
// onboarding token, and with its own or the victim's session key, to
// onboard as the victim while the registration is gone.
func TestAzureCachedTokenAfterDeletionWithAnotherVMsSession(t *testing.T) {
	Attack(t, "a captured Azure token of a VM whose registration was deleted is re-presented with another VM's onboarding token and session")
	w := newAzureWorld(t)
	victim := w.onboardSession(azuretest.DefaultVM(), "10.1.0.4", "victim-session-key-0000000000000000000000000000000000")
	attacker := w.onboardSession(otherAzureVM(), "10.1.0.5", "attacker-session-key-000000000000000000000000000000000")
	w.deleteRegistration(victim)
	for name, key := range map[string]string{"the other VM's session key": attacker.sessionKey, "the victim's session key": victim.sessionKey} {
		_, err := w.renew(victim.imdsToken, attacker.onboard, key)
		wantCode(t, name, err, codes.Unauthenticated, "Replayed", "another workload's")
	}
	w.assertAgentOnboardsAgain(victim)
}

// The victim's registration is deleted; its onboarding token leaked with
// its cached token, but not its session key: the pair with any other key,
// or the victim's onboarding token of before the session was bound (no
// session key on its Authorize), is refused.
func TestAzureCachedTokenAfterDeletionWithWrongSessionKey(t *testing.T) {
	Attack(t, "a captured Azure token of a VM whose registration was deleted is re-presented with the VM's onboarding token but not its session key")
	w := newAzureWorld(t)
	victim := w.onboardSession(azuretest.DefaultVM(), "10.1.0.4", "victim-session-key-0000000000000000000000000000000000")
	attacker := w.onboardSession(otherAzureVM(), "10.1.0.5", "attacker-session-key-000000000000000000000000000000000")
	w.deleteRegistration(victim)
	for name, key := range map[string]string{"a guessed key": "0123456789abcdef0123456789abcdef", "another VM's key": attacker.sessionKey} {
		_, err := w.renew(victim.imdsToken, victim.onboard, key)
		wantCode(t, name, err, codes.Unauthenticated, "Replayed", "another agent session")
	}

	// An onboarding token bound to no session (its Authorize carried no
	// session key) shows no session once the registration is gone.
	third := otherAzureVM()
	third.Name, third.VMID, third.PrincipalID, third.IP = "details-1", "7e4f2a1b-9d3c-4b6e-8f0a-2c3d4e5f6a71", "3d5f7b9c-2e4a-4b6c-9d8e-0f1a2b3c4d5e", "10.1.0.6"
	unbound := w.onboardVM(third, third.IP)
	w.deleteRegistration(unbound)
	_, err := w.renew(unbound.imdsToken, unbound.onboard, unbound.sessionKey)
	wantCode(t, "an unbound onboarding token", err, codes.Unauthenticated, "Replayed", "bound to no agent session")

	w.assertAgentOnboardsAgain(victim)
}

// The victim's registration is deleted and its onboarding token and session
// key leak later, after the onboarding token expired (from a backup of the
// VM's disk, say): the expired token shows no session.
func TestAzureCachedTokenAfterDeletionWithExpiredOnboardingToken(t *testing.T) {
	Attack(t, "a captured Azure token of a VM whose registration was deleted is re-presented with the VM's expired onboarding token and its session key")
	var ahead atomic.Int64 // how far the onboarding token issuer's clock is ahead
	w := newAzureWorldWith(t, onboardingOptions{tokenClock: func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }})
	victim := w.onboardSession(azuretest.DefaultVM(), "10.1.0.4", "victim-session-key-0000000000000000000000000000000000")
	w.deleteRegistration(victim)
	ahead.Store(int64(2 * time.Hour)) // the 1h onboarding token expired; the managed identity token (24h) did not
	_, err := w.renew(victim.imdsToken, victim.onboard, victim.sessionKey)
	wantCode(t, "an expired onboarding token", err, codes.Unauthenticated, "Replayed", "onboarding token is refused", "Expired")
	assertNoRegistrations(t, w.ns)
}

// The agent's onboarding token leaks (it is bound to the agent's session)
// but not its session key: Register with it, without the key or with
// another, would bind the VM's registration to the attacker's session (an
// Azure token is a fresh proof, which may take a registration over).
func TestLeakedBoundOnboardingTokenRegisters(t *testing.T) {
	Attack(t, "an agent's leaked onboarding token, bound to its session, registers without the session key and takes the registration over")
	w := newAzureWorld(t)
	victim := w.onboardSession(azuretest.DefaultVM(), "10.1.0.4", "victim-session-key-0000000000000000000000000000000000")
	for name, key := range map[string]string{"no session key": "", "the attacker's key": "attacker-session-key-000000000000000000000000000000000"} {
		_, err := w.register(victim.onboard, key, victim.address, "VPC")
		wantCode(t, name, err, codes.Unauthenticated, "bound to another agent session", endpoint.SessionKeyMetadata)
	}
	// The registration stays the agent's: its sidecar token renews.
	if _, err := w.client.RenewSidecarToken(w.call(victim.onboard, victim.sessionKey), &onboardingv1alpha1.RenewSidecarTokenRequest{}); err != nil {
		t.Fatalf("the agent's sidecar token renewal: %v", err)
	}
}
