package adversarial

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/gce"
	"github.com/embark-mesh/embark/onboarding/identity/gce/gcetest"
)

// gceCheckWorld is an endpoint trusting a loopback Google and confirming
// instances with a loopback Compute API (identity.gce.instanceCheck), with
// two running instances of project embark-test in one subnet: the victim
// ratings-1 (nic0 10.128.0.7) and the attacker ratings-2 (nic0 10.128.0.8).
type gceCheckWorld struct {
	*gceWorld
	compute          *gcetest.ComputeAPI
	victim, attacker gcetest.Instance
}

func newGCECheckWorld(t *testing.T, cidrs ...authorizationv1alpha1.CIDR) *gceCheckWorld {
	t.Helper()
	g, err := gcetest.NewGoogle()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	api := gcetest.NewComputeAPI()
	t.Cleanup(api.Close)
	checker, err := gce.NewChecker(gce.CheckerOptions{Endpoint: api.URL(), TokenSource: api.TokenSource()})
	if err != nil {
		t.Fatal(err)
	}
	v, err := gce.NewVerifier(gce.Config{Audiences: []string{audience}, JWKSURL: g.JWKSURL(), CACertificates: g.CACertificates(),
		InstanceCheck: checker})
	if err != nil {
		t.Fatal(err)
	}
	w := &gceCheckWorld{gceWorld: &gceWorld{onboarding: newOnboarding(t, onboardingOptions{gce: v, detailed: true}), google: g}, compute: api}
	w.victim = gcetest.DefaultInstance()
	w.attacker = gcetest.DefaultInstance()
	w.attacker.InstanceID, w.attacker.InstanceName, w.attacker.IP = "6000000000000000002", "ratings-2", "10.128.0.8"
	api.PutInstance(w.victim)
	api.PutInstance(w.attacker)
	w.policy("gce-embark-test", authorizationv1alpha1.AllowRule{
		Workloads:    []authorizationv1alpha1.WorkloadMatcher{{GCP: &authorizationv1alpha1.GCPMatcher{Projects: []string{"embark-test"}}}},
		OnboardTo:    []authorizationv1alpha1.OnboardTarget{{}},
		AddressCIDRs: cidrs,
	})
	w.group("ratings")
	return w
}

// A GCE instance's valid token is presented with another VM's address
// (to be taken for it, or to hold it). With the instance check on, the
// rule needs no addressCIDRs: the instance proves its own nic0 address
// and nothing else.
func TestGCEInstanceClaimsAnotherVMsAddress(t *testing.T) {
	Attack(t, "a GCE instance the Compute API confirmed registers another VM's address")
	w := newGCECheckWorld(t)
	res, err := w.authorize(w.token(w.attacker, audience))
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.register(res.GetToken(), "", w.victim.IP, "VPC")
	wantCode(t, "register", err, codes.PermissionDenied, w.victim.IP, "not proven", "Compute API confirmed only the instance's nic0 address 10.128.0.8")
	assertNoRegistrations(t, w.ns)

	reg, err := w.register(res.GetToken(), "", w.attacker.IP, "VPC")
	if err != nil {
		t.Fatalf("the instance's own nic0 address: %v", err)
	}
	we, err := w.workloadEntry(w.ns, reg.GetRegistrationName())
	if err != nil {
		t.Fatal(err)
	}
	if we.Spec.Address != w.attacker.IP {
		t.Errorf("WorkloadEntry address %s, want the Compute API's networkIP %s", we.Spec.Address, w.attacker.IP)
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: w.ns, Name: reg.GetRegistrationName()}, war); err != nil {
		t.Fatal(err)
	}
	if id := war.Spec.Identity.GCP; id == nil || !id.InstanceConfirmed {
		t.Errorf("registration identity %+v, want gcp with instanceConfirmed", war.Spec.Identity)
	}
}

// While a rule still lists the subnet in addressCIDRs, an instance
// registers the address of another VM of the subnet that has not
// registered yet. Without a proven address that VM could then never
// register (an unproven holder blocks it, FAILED_PRECONDITION); with the
// instance check its nic0 address is proven and fences the squatter.
func TestGCEInstanceSquatsAnotherVMsAddress(t *testing.T) {
	Attack(t, "a GCE instance holds another VM's address (allowed by addressCIDRs) so that VM cannot register")
	w := newGCECheckWorld(t, "10.128.0.0/20")
	ares, err := w.authorize(w.token(w.attacker, audience))
	if err != nil {
		t.Fatal(err)
	}
	squat, err := w.register(ares.GetToken(), "", w.victim.IP, "VPC")
	if err != nil {
		t.Fatalf("the attacker's registration of an address in addressCIDRs: %v", err)
	}
	we, err := w.workloadEntry(w.ns, squat.GetRegistrationName())
	if err != nil {
		t.Fatal(err)
	}
	waitCached(t, we)

	vres, err := w.authorize(w.token(w.victim, audience))
	if err != nil {
		t.Fatal(err)
	}
	reg, err := w.register(vres.GetToken(), "", w.victim.IP, "VPC")
	if err != nil {
		t.Fatalf("the victim's registration of its own nic0 address: %v", err)
	}
	if we, err := w.workloadEntry(w.ns, reg.GetRegistrationName()); err != nil || we.Spec.Address != w.victim.IP {
		t.Fatalf("the victim's WorkloadEntry: %v, %v; want address %s", we.Spec.Address, err, w.victim.IP)
	}
	if _, err := w.workloadEntry(w.ns, squat.GetRegistrationName()); !apierrors.IsNotFound(err) {
		t.Fatalf("the squatter's WorkloadEntry: %v, want it removed (fenced)", err)
	}
}

// The name in a token outlives the instance: a token issued to an instance
// since deleted (and a new one created under its name) does not onboard,
// nor does one of a stopped instance; a Compute API that cannot answer is
// retryable, not a refusal.
func TestGCETokenOfAReplacedInstance(t *testing.T) {
	Attack(t, "a GCE token of an instance deleted and recreated under its name, or stopped, onboards")
	w := newGCECheckWorld(t)
	tok := w.token(w.victim, audience)
	replaced := gcetest.ComputeOf(w.victim)
	replaced.ID = "7000000000000000003"
	w.compute.Put(w.victim.ProjectID, w.victim.Zone, replaced)
	_, err := w.authorize(tok)
	wantCode(t, "replaced", err, codes.Unauthenticated, "InstanceReplaced", "ID 7000000000000000003")

	stopped := gcetest.ComputeOf(w.attacker)
	stopped.Status = "STOPPING"
	w.compute.Put(w.attacker.ProjectID, w.attacker.Zone, stopped)
	_, err = w.authorize(w.token(w.attacker, audience))
	wantCode(t, "stopped", err, codes.Unauthenticated, "InstanceNotRunning", "STOPPING")
	assertNoRegistrations(t, w.ns)

	// Another instance name: not cached, so the API is asked, and fails.
	other := w.victim
	other.InstanceID, other.InstanceName = "6000000000000000004", "ratings-4"
	w.compute.PutInstance(other)
	w.compute.Fail(500)
	_, err = w.authorize(w.token(other, audience))
	wantCode(t, "API failing", err, codes.Unavailable, "InstanceCheckUnavailable")
}

// Anyone can create instances in a project of their own and present their
// genuine tokens: each must not cost a Compute API call (the calls share one
// rate limit with every legitimate instance), only a policy refusal.
func TestGCEForeignTokensSpendTheComputeAPIRateLimit(t *testing.T) {
	Attack(t, "GCE tokens of an attacker's own project spend the Compute API calls every instance shares")
	w := newGCECheckWorld(t)
	for i := range 15 { // more than the default burst
		foreign := w.attacker
		foreign.ProjectID, foreign.ProjectNumber = "attacker-project", 999999999999
		foreign.InstanceID = fmt.Sprintf("90000000000000000%02d", i)
		_, err := w.authorize(w.token(foreign, audience))
		wantCode(t, "foreign project", err, codes.PermissionDenied, "project attacker-project not in [embark-test]")
	}
	if n := w.compute.Calls(); n != 0 {
		t.Fatalf("%d Compute API calls for instances no policy allows, want 0", n)
	}
	if _, err := w.authorize(w.token(w.victim, audience)); err != nil {
		t.Fatalf("the policy's own instance afterwards: %v", err)
	}
	if n := w.compute.Calls(); n != 1 {
		t.Fatalf("%d Compute API calls, want 1", n)
	}
}
