package adversarial

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/identity/aws/profile"
	"github.com/embark-mesh/embark/test/fixtures"
)

// wantCode fails t unless err has code and its message holds every part of
// want.
func wantCode(t *testing.T, what string, err error, code codes.Code, want ...string) {
	t.Helper()
	if got := status.Code(err); got != code {
		t.Fatalf("%s: code %v (%v), want %v", what, got, err, code)
	}
	for _, w := range want {
		if !strings.Contains(status.Convert(err).Message(), w) {
			t.Errorf("%s: message %q does not name %q", what, status.Convert(err).Message(), w)
		}
	}
}

// A copy of a victim's instance identity document (no STS proof: anything
// on the instance, an SSRF to IMDS or a log can leak it) is presented from
// elsewhere: it must neither move the registration to another address, nor
// take the registration over at the victim's own address, nor renew the
// victim's sidecar token, nor unregister the victim.
func TestCopiedIdentityDocumentTakesOverARegistration(t *testing.T) {
	Attack(t, "copied instance identity document without STS takes over a registration or gets its sidecar token")
	h := newOnboarding(t, onboardingOptions{})
	h.policy("any-ec2", anyEC2())
	h.group("ratings")
	victim := h.instance(awstest.Instance{InstanceID: "i-0aaaaaaaaaaaaaa01", PrivateIP: "10.0.0.10"})

	auth, err := h.authorizeAWS("ratings", victim, false)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := h.register(auth.GetToken(), "", "10.0.0.10", "VPC")
	if err != nil {
		t.Fatal(err)
	}
	if reg.GetSessionKey() == "" {
		t.Fatal("Register answered no session key")
	}
	h.markConnected(reg.GetRegistrationName())

	copied, err := h.authorizeAWS("ratings", victim, false) // the same document, copied
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.register(copied.GetToken(), "", "10.9.9.9", "VPC")
	wantCode(t, "register from another address", err, codes.PermissionDenied, "10.9.9.9", "not proven", "10.0.0.10")
	_, err = h.register(copied.GetToken(), "", "10.0.0.10", "VPC")
	wantCode(t, "register at the victim's address", err, codes.PermissionDenied, "another agent session", "STS proof")
	_, err = h.register(copied.GetToken(), "guessed-key", "10.0.0.10", "VPC")
	wantCode(t, "register with a guessed session key", err, codes.PermissionDenied, "another agent session")
	_, err = h.client.RenewSidecarToken(h.call(copied.GetToken(), ""), &onboardingv1alpha1.RenewSidecarTokenRequest{})
	wantCode(t, "renew the victim's sidecar token", err, codes.PermissionDenied, "another agent session")
	_, err = h.client.Unregister(h.call(copied.GetToken(), ""), &onboardingv1alpha1.UnregisterRequest{})
	wantCode(t, "unregister the victim", err, codes.PermissionDenied, "another agent session")

	we, err := h.workloadEntry(h.ns, reg.GetRegistrationName())
	if err != nil || we.Spec.Address != "10.0.0.10" {
		t.Fatalf("victim's WorkloadEntry %q (%v), want it kept at 10.0.0.10", we.Spec.Address, err)
	}
	// The victim itself, holding its session key, carries on.
	if _, err := h.client.RenewSidecarToken(h.call(auth.GetToken(), reg.GetSessionKey()), &onboardingv1alpha1.RenewSidecarTokenRequest{}); err != nil {
		t.Errorf("the victim's own renewal: %v", err)
	}
	if _, err := h.register(copied.GetToken(), reg.GetSessionKey(), "10.0.0.10", "VPC"); err != nil {
		t.Errorf("the victim's own re-registration: %v", err)
	}
}

// An instance that proves its role session with STS may take its own
// registration over (e.g. after its agent lost its session key): that is
// the documented way back, and it must keep working.
func TestSTSProofTakesOverItsOwnRegistration(t *testing.T) {
	h := newOnboarding(t, onboardingOptions{profileCheck: true})
	h.policy("any-ec2", anyEC2())
	h.group("ratings")
	m := h.instance(awstest.Instance{InstanceID: "i-0aaaaaaaaaaaaaa02", PrivateIP: "10.0.0.11", Role: "ratings-role"})
	first, err := h.authorizeAWS("ratings", m, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.register(first.GetToken(), "", "10.0.0.11", "VPC"); err != nil {
		t.Fatal(err)
	}
	again, err := h.authorizeAWS("ratings", m, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.register(again.GetToken(), "", "10.0.0.11", "VPC"); err != nil {
		t.Fatalf("an STS-proven re-registration without the session key: %v", err)
	}
}

// A workload allowed in namespace A claims the address of a workload in
// namespace B (overlapping VPCs make the same private IP legitimate in two
// accounts): its registration must not evict B's WorkloadEntry.
func TestCrossNamespaceFencing(t *testing.T) {
	Attack(t, "registration in one namespace fences (evicts) a WorkloadEntry in another")
	victim := newOnboarding(t, onboardingOptions{})
	victim.policy("any-ec2", anyEC2())
	victim.group("ratings")
	vm := victim.instance(awstest.Instance{InstanceID: "i-0aaaaaaaaaaaaaa03", PrivateIP: "10.0.0.20"})
	auth, err := victim.authorizeAWS("ratings", vm, false)
	if err != nil {
		t.Fatal(err)
	}
	vreg, err := victim.register(auth.GetToken(), "", "10.0.0.20", "VPC")
	if err != nil {
		t.Fatal(err)
	}
	we, err := victim.workloadEntry(victim.ns, vreg.GetRegistrationName())
	if err != nil {
		t.Fatal(err)
	}
	waitCached(t, we)

	attacker := newOnboarding(t, onboardingOptions{})
	attacker.policy("any-ec2", anyEC2())
	attacker.group("ratings")
	am := attacker.instance(awstest.Instance{InstanceID: "i-0aaaaaaaaaaaaaa04", PrivateIP: "10.0.0.20"})
	aauth, err := attacker.authorizeAWS("ratings", am, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := attacker.register(aauth.GetToken(), "", "10.0.0.20", "VPC"); err != nil {
		// Refusing is acceptable too; evicting is not.
		t.Logf("attacker's registration: %v", err)
	}
	if _, err := victim.workloadEntry(victim.ns, vreg.GetRegistrationName()); err != nil {
		t.Fatalf("the other namespace's WorkloadEntry: %v, want it kept", err)
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: victim.ns, Name: vreg.GetRegistrationName()}, war); err != nil {
		t.Fatal(err)
	}
	for _, c := range war.Status.Conditions {
		if c.Type == runtimev1alpha1.ConditionFenced && c.Status == "True" {
			t.Errorf("the other namespace's registration is marked fenced: %s", c.Message)
		}
	}
}

// Addresses that can never be a workload's: loopback, link-local (the
// instance metadata service), unspecified, multicast, a cluster Service IP,
// an IPv4-mapped IPv6 address. Even a rule allowing every address must not
// let them through, and the refusal must be InvalidArgument (the agent stops
// retrying) naming the field.
func TestUnroutableWorkloadAddresses(t *testing.T) {
	Attack(t, "loopback, link-local, multicast, Service or IPv4-mapped IP as a workload address")
	is := newJWTIssuer(t, "corp")
	h := newOnboarding(t, onboardingOptions{issuers: []*jwtIssuer{is}})
	h.policy("hosts", jwtRule(is, "0.0.0.0/0", "::/0"))
	h.group("ratings")
	auth, err := h.authorizeJWT("ratings", is.mint(t, "vm-1", nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range []string{"127.0.0.1", "::1", "169.254.169.254", "fe80::1", "0.0.0.0", "::", "224.0.0.1", "ff02::1", "10.96.0.10", "::ffff:10.0.0.5"} {
		_, err := h.register(auth.GetToken(), "", ip, "INTERNET")
		wantCode(t, ip, err, codes.InvalidArgument, "addresses[0].ip")
	}
	assertNoRegistrations(t, h.ns)
}

// An identity that no policy could allow still makes the endpoint call STS
// (any AWS customer's genuine document and a signed request).
func TestSTSCalledForIdentitiesNoPolicyAllows(t *testing.T) {
	Attack(t, "STS called for an identity no policy allows")
	h := newOnboarding(t, onboardingOptions{detailed: true, profileCheck: true})
	h.policy("any-ec2", anyEC2())
	h.group("ratings")
	stranger := h.instance(awstest.Instance{Account: "999999999999", InstanceID: "i-0aaaaaaaaaaaaaa05", Role: "ratings-role"})
	cred := h.awsCredential(stranger, true)
	if cred.Aws.GetStsGetCallerIdentity() == nil {
		t.Fatal("the attacker's credential carries no signed STS request")
	}
	before := h.aws.STS.Calls()
	_, err := h.client.Authorize(t.Context(), &onboardingv1alpha1.AuthorizeRequest{
		WorkloadGroup: &onboardingv1alpha1.WorkloadGroupRef{Namespace: h.ns, Name: "ratings"}, Credential: cred,
	})
	wantCode(t, "authorize", err, codes.PermissionDenied, "999999999999")
	if got := h.aws.STS.Calls() - before; got != 0 {
		t.Errorf("STS was called %d times for an identity no policy allows, want 0", got)
	}
	// An allowed instance's proof still reaches STS.
	ok := h.instance(awstest.Instance{InstanceID: "i-0aaaaaaaaaaaaaa06", Role: "ratings-role"})
	before = h.aws.STS.Calls()
	if _, err := h.authorizeAWS("ratings", ok, true); err != nil {
		t.Fatal(err)
	}
	if h.aws.STS.Calls() == before {
		t.Error("an allowed identity's STS proof was not checked")
	}
}

// corp/lab-host1 and corp-lab/host1 spell the same jwt-corp-lab-host1: the
// second host must not share (and renew tokens of) the first's registration.
func TestJWTRegistrationNamesCollideAcrossIssuers(t *testing.T) {
	Attack(t, "JWT registration names collide across issuers (corp/lab-host1 = corp-lab/host1)")
	corp, corpLab := newJWTIssuer(t, "corp"), newJWTIssuer(t, "corp-lab")
	h := newOnboarding(t, onboardingOptions{issuers: []*jwtIssuer{corp, corpLab}})
	h.policy("hosts", jwtRule(corp, "192.0.2.0/24"), jwtRule(corpLab, "192.0.2.0/24"))
	h.group("ratings")
	a, err := h.authorizeJWT("ratings", corp.mint(t, "lab-host1", nil))
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.authorizeJWT("ratings", corpLab.mint(t, "host1", nil))
	if err != nil {
		t.Fatal(err)
	}
	if a.GetRegistrationName() == b.GetRegistrationName() {
		t.Fatalf("both hosts are named %s", a.GetRegistrationName())
	}
	ra, err := h.register(a.GetToken(), "", "192.0.2.1", "INTERNET")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.register(b.GetToken(), "", "192.0.2.2", "INTERNET"); err != nil {
		t.Fatalf("second host: %v", err)
	}
	_, err = h.client.RenewSidecarToken(h.call(b.GetToken(), ra.GetSessionKey()), &onboardingv1alpha1.RenewSidecarTokenRequest{})
	if err == nil {
		// b's token names b's registration; it must never reach a's.
		war := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: h.ns, Name: b.GetRegistrationName()}, war); err != nil || war.Spec.Identity.JWT.Subject != "host1" {
			t.Fatalf("b renewed a token of registration %s (%v)", b.GetRegistrationName(), err)
		}
	}
}

// Lists written as [] (as kubectl sends them from YAML) must not mean
// "anything": the API server refuses them, and evaluation treats a stored
// one as matching nothing (onboarding/policy tests).
func TestEmptyListsMeanAnything(t *testing.T) {
	Attack(t, "empty lists (iamRoleNames: [], subjects: [], zones: []) admitted as 'anything'")
	ns := env.Namespace(t)
	for name, matcher := range map[string]map[string]any{
		"roles":    {"aws": map[string]any{"accounts": []any{"123456789012"}, "ec2": map[string]any{"iamRoleNames": []any{}}}},
		"zones":    {"aws": map[string]any{"accounts": []any{"123456789012"}, "zones": []any{}}},
		"subjects": {"jwt": map[string]any{"issuer": "https://corp.idp.example", "subjects": []any{}}},
	} {
		p := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": authorizationv1alpha1.SchemeGroupVersion.String(), "kind": "OnboardingPolicy",
			"metadata": map[string]any{"name": "empty-" + name, "namespace": ns},
			"spec": map[string]any{"allow": []any{map[string]any{
				"workloads": []any{matcher}, "onboardTo": []any{map[string]any{"workloadGroupSelector": map[string]any{}}},
			}}},
		}}
		if err := env.Client.Create(t.Context(), p); !apierrors.IsInvalid(err) {
			t.Errorf("%s: create = %v, want Invalid", name, err)
		}
	}
}

// A workload keeps renewing its sidecar token after the policy that
// admitted it is deleted.
func TestRenewSidecarTokenAfterPolicyRemoved(t *testing.T) {
	Attack(t, "RenewSidecarToken after the policy no longer allows the workload")
	h := newOnboarding(t, onboardingOptions{detailed: true})
	p := h.policy("any-ec2", anyEC2())
	h.group("ratings")
	m := h.instance(awstest.Instance{InstanceID: "i-0aaaaaaaaaaaaaa07", PrivateIP: "10.0.0.30"})
	auth, err := h.authorizeAWS("ratings", m, false)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := h.register(auth.GetToken(), "", "10.0.0.30", "VPC")
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	waitGone(t, p)
	_, err = h.client.RenewSidecarToken(h.call(auth.GetToken(), reg.GetSessionKey()), &onboardingv1alpha1.RenewSidecarTokenRequest{})
	wantCode(t, "renew", err, codes.PermissionDenied, "ratings")
}

// The issuer's JWKS URL redirects to a host the attacker controls, which
// serves the attacker's key: a token signed with it must be refused.
func TestJWKSRedirectToAnotherOrigin(t *testing.T) {
	Attack(t, "JWKS fetch follows a redirect to another origin serving the attacker's key")
	is := newJWTIssuer(t, "corp")
	evilKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	evil := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { writeJWKS(w, &evilKey.PublicKey) }))
	t.Cleanup(evil.Close)
	redirector := httptest.NewTLSServer(http.RedirectHandler(evil.URL+"/keys", http.StatusFound))
	t.Cleanup(redirector.Close)
	// The endpoint trusts the redirector's and the evil server's
	// certificates, as a compromised or misconfigured IdP front would have.
	is.server.Close()
	is.server = redirector
	h := newOnboarding(t, onboardingOptions{issuers: []*jwtIssuer{is, {short: "evil", url: "https://evil.idp.example", server: evil}}})
	h.policy("hosts", jwtRule(is, "192.0.2.0/24"))
	h.group("ratings")
	_, err = h.authorizeJWT("ratings", is.mint(t, "vm-1", evilKey))
	wantCode(t, "authorize", err, codes.Unauthenticated)
}

// The same IPv6 address written two ways is one address: the second
// spelling must not register beside the first (two WorkloadEntries, no
// fencing), and what is stored is the canonical form.
func TestIPv6TwoSpellings(t *testing.T) {
	Attack(t, "the same IPv6 address written two ways registers twice")
	is := newJWTIssuer(t, "corp")
	h := newOnboarding(t, onboardingOptions{issuers: []*jwtIssuer{is}})
	h.policy("hosts", jwtRule(is, "2001:db8::/64"))
	h.group("ratings")
	a, err := h.authorizeJWT("ratings", is.mint(t, "vm-a", nil))
	if err != nil {
		t.Fatal(err)
	}
	ra, err := h.register(a.GetToken(), "", "2001:DB8:0:0:0:0:0:20", "INTERNET")
	if err != nil {
		t.Fatal(err)
	}
	we, err := h.workloadEntry(h.ns, ra.GetRegistrationName())
	if err != nil || we.Spec.Address != "2001:db8::20" {
		t.Fatalf("stored address %q (%v), want 2001:db8::20", we.Spec.Address, err)
	}
	waitCached(t, we)
	b, err := h.authorizeJWT("ratings", is.mint(t, "vm-b", nil))
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.register(b.GetToken(), "", "2001:db8::20", "INTERNET")
	wantCode(t, "second spelling", err, codes.FailedPrecondition, "2001:db8::20")
}

func assertNoRegistrations(t *testing.T, ns string) {
	t.Helper()
	list := &runtimev1alpha1.WorkloadAutoRegistrationList{}
	if err := env.Client.List(t.Context(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) > 0 {
		t.Errorf("%d registrations were written, want none", len(list.Items))
	}
}

func waitGone(t *testing.T, obj client.Object) {
	t.Helper()
	for range 1500 {
		got := obj.DeepCopyObject().(client.Object)
		if err := cached.Get(t.Context(), client.ObjectKeyFromObject(obj), got); apierrors.IsNotFound(err) {
			return
		}
		sleep(t)
	}
	t.Fatalf("%s still cached", obj.GetName())
}

// profileChecker is the endpoint's instance profile check with the real
// EC2 and IAM SDK clients pointed at fake, a loopback fake of EC2/IAM (a
// true external edge), signing with the fake's credentials.
func profileChecker(t *testing.T, fake *awstest.EC2IAM) *profile.Checker {
	t.Helper()
	clients, err := profile.NewClients(t.Context(), profile.ClientOptions{EC2Endpoint: fake.URL, IAMEndpoint: fake.URL,
		Credentials: credentials.NewStaticCredentialsProvider(fake.AccessKeyID, fake.SecretAccessKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	c, err := profile.New(profile.Options{Clients: clients})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Anyone allowed to sts:AssumeRole into an instance role can name the
// session after any instance ID, and STS then answers exactly what it
// answers for the instance's own credentials
// (assumed-role/<role>/<instance-id>). With the instance profile check on,
// the endpoint asks EC2 which profile the instance carries now and IAM
// which role that profile holds: a proof of a role the instance's profile
// does not carry (or of an instance with no profile) is refused. Here the
// fake STS mints the session as AssumeRole would; what the endpoint sees is
// the same either way.
func TestSTSProofFromARoleSessionOutsideTheInstance(t *testing.T) {
	Attack(t, "STS proof of an instance role session that did not come from the instance's instance profile")
	fake := awstest.NewEC2IAM()
	t.Cleanup(fake.Close)
	h := newOnboarding(t, onboardingOptions{profiles: profileChecker(t, fake)})
	h.policy("ratings-role", authorizationv1alpha1.AllowRule{
		Workloads: []authorizationv1alpha1.WorkloadMatcher{{AWS: &authorizationv1alpha1.AWSMatcher{Accounts: []string{fixtures.Account},
			EC2: &authorizationv1alpha1.EC2Matcher{IAMRoleNames: []string{"ratings-role"}}}}},
		OnboardTo: []authorizationv1alpha1.OnboardTarget{{}},
	})
	h.group("ratings")
	const (
		buildProfile   = "arn:aws:iam::123456789012:instance-profile/build"
		ratingsProfile = "arn:aws:iam::123456789012:instance-profile/vms/ratings"
	)
	fake.SetProfile(buildProfile, "build-role")
	fake.SetProfile(ratingsProfile, "ratings-role")

	// The instance's profile carries another role.
	other := h.instance(awstest.Instance{InstanceID: "i-0aaaaaaaaaaaaaa07", Role: "ratings-role"})
	fake.Associate("i-0aaaaaaaaaaaaaa07", buildProfile)
	_, err := h.authorizeAWS("ratings", other, true)
	wantCode(t, "role outside the instance's profile", err, codes.PermissionDenied, "i-0aaaaaaaaaaaaaa07", "does not carry role ratings-role")

	// The instance has no profile at all.
	bare := h.instance(awstest.Instance{InstanceID: "i-0aaaaaaaaaaaaaa08", Role: "ratings-role"})
	_, err = h.authorizeAWS("ratings", bare, true)
	wantCode(t, "instance without a profile", err, codes.PermissionDenied, "i-0aaaaaaaaaaaaaa08", "no instance profile")

	// Control: the instance's own profile carries the role.
	own := h.instance(awstest.Instance{InstanceID: "i-0aaaaaaaaaaaaaa09", Role: "ratings-role"})
	fake.Associate("i-0aaaaaaaaaaaaaa09", ratingsProfile)
	if _, err := h.authorizeAWS("ratings", own, true); err != nil {
		t.Fatalf("an instance whose profile carries the role: %v", err)
	}
	if fake.Calls("DescribeIamInstanceProfileAssociations") != 3 {
		t.Errorf("EC2 asked %d times, want 3 (once per instance)", fake.Calls("DescribeIamInstanceProfileAssociations"))
	}
}
