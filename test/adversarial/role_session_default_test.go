package adversarial

import (
	"testing"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/fixtures"
)

// Anyone allowed to sts:AssumeRole into an instance role can name the
// session after any instance ID; STS then answers for that session exactly
// what it answers for the instance's own credentials. With the endpoint's
// DEFAULT configuration (no identity.aws.instanceProfileCheck), such a
// proof must not admit the attacker as the instance into a group whose
// policy names the role: an STS proof alone does not show the session came
// from the instance. (TestSTSProofFromARoleSessionOutsideTheInstance
// covers the configured check.) Here the fake STS mints the session as
// AssumeRole would; what the endpoint sees is the same either way.
func TestSTSRoleSessionAcceptedByDefault(t *testing.T) {
	Attack(t, "default configuration: an STS proof of a role session named after an instance, not taken from it, onboards as the instance")
	h := newOnboarding(t, onboardingOptions{})
	h.policy("ratings-role", authorizationv1alpha1.AllowRule{
		Workloads: []authorizationv1alpha1.WorkloadMatcher{{AWS: &authorizationv1alpha1.AWSMatcher{Accounts: []string{fixtures.Account},
			EC2: &authorizationv1alpha1.EC2Matcher{IAMRoleNames: []string{"ratings-role"}}}}},
		OnboardTo: []authorizationv1alpha1.OnboardTarget{{}},
	}, authorizationv1alpha1.AllowRule{
		Workloads: []authorizationv1alpha1.WorkloadMatcher{{AWS: &authorizationv1alpha1.AWSMatcher{Accounts: []string{fixtures.Account},
			EC2: &authorizationv1alpha1.EC2Matcher{RequireSTSProof: true}}}},
		OnboardTo: []authorizationv1alpha1.OnboardTarget{{WorkloadGroupSelector: selectApp("details")}},
	})
	h.group("ratings")
	h.group("details")

	victim := h.instance(awstest.Instance{InstanceID: "i-0aaaaaaaaaaaaac01", Role: "ratings-role"})
	cred := h.awsCredential(victim, true)
	if cred.Aws.GetStsGetCallerIdentity() == nil {
		t.Fatal("the attacker's credential carries no signed STS request")
	}
	for _, group := range []string{"ratings", "details"} {
		_, err := h.authorizeAWS(group, victim, true)
		wantCode(t, "authorize into "+group+" with a role session named after the instance", err, codes.PermissionDenied)
	}
	assertNoRegistrations(t, h.ns)
}

// selectApp selects the WorkloadGroups labelled app=<app> (h.group labels
// each group with its name).
func selectApp(app string) metav1.LabelSelector {
	return metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}
}
