package adversarial

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
)

// An authorized VM reports a "last onboarding error" meant for the
// operator's terminal rather than for its registration's status: a message
// of megabytes, terminal escape sequences and newlines that rewrite what
// `kubectl describe war` shows, a reason with spaces and newlines that
// forges extra columns in `kubectl get war -o wide`. Each is refused with
// INVALID_ARGUMENT naming the field and nothing is written; a well-formed
// report reaches status.agent.
func TestAgentReportsAForgedLastError(t *testing.T) {
	Attack(t, "an authorized VM reports a last onboarding error that is oversized, carries control characters or forges a reason")
	h := newOnboarding(t, onboardingOptions{})
	h.policy("any-ec2", anyEC2())
	h.group("ratings")
	vm := h.instance(awstest.Instance{InstanceID: "i-0aaaaaaaaaaaaac01", PrivateIP: "10.0.0.41"})

	register := func(last *onboardingv1alpha1.AgentError) (*onboardingv1alpha1.RegisterResponse, error) {
		auth, err := h.authorizeAWS("ratings", vm, false)
		if err != nil {
			t.Fatal(err)
		}
		return h.client.Register(h.call(auth.GetToken(), ""), &onboardingv1alpha1.RegisterRequest{
			Addresses:     []*onboardingv1alpha1.HostAddress{{Ip: "10.0.0.41", Type: "VPC"}},
			ConnectedOver: "VPC", AgentVersion: "v1.4.0", LastError: last,
		})
	}
	for _, tc := range []struct {
		name  string
		last  *onboardingv1alpha1.AgentError
		field string
	}{
		{"oversized message", &onboardingv1alpha1.AgentError{Reason: "Unavailable", Message: strings.Repeat("x", 1<<20)}, "last_error.message"},
		{"message one byte too long", &onboardingv1alpha1.AgentError{Reason: "Unavailable", Message: strings.Repeat("x", 257)}, "last_error.message"},
		{"terminal escape", &onboardingv1alpha1.AgentError{Reason: "Unavailable", Message: "ok\x1b[2J\x1b[1;1HStatus: Healthy"}, "last_error.message"},
		{"newline", &onboardingv1alpha1.AgentError{Reason: "Unavailable", Message: "ok\nConditions: Ready"}, "last_error.message"},
		{"reason with spaces", &onboardingv1alpha1.AgentError{Reason: "None   Healthy", Message: "x"}, "last_error.reason"},
		{"reason with newline", &onboardingv1alpha1.AgentError{Reason: "Unavailable\nv9.9.9", Message: "x"}, "last_error.reason"},
		{"empty reason", &onboardingv1alpha1.AgentError{Message: "x"}, "last_error.reason"},
		{"long reason", &onboardingv1alpha1.AgentError{Reason: "A" + strings.Repeat("a", 64)}, "last_error.reason"},
	} {
		_, err := register(tc.last)
		wantCode(t, tc.name, err, codes.InvalidArgument, tc.field)
	}
	assertNoRegistrations(t, h.ns)

	reg, err := register(&onboardingv1alpha1.AgentError{Reason: "PermissionDenied", Message: "not authorized to onboard (request id 0123456789abcdef)"})
	if err != nil {
		t.Fatalf("well-formed last error: %v", err)
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: h.ns, Name: reg.GetRegistrationName()}, war); err != nil {
		t.Fatal(err)
	}
	got := war.Status.Agent
	if got == nil || got.Version != "v1.4.0" || got.LastError == nil || got.LastError.Reason != "PermissionDenied" ||
		got.LastError.Message != "not authorized to onboard (request id 0123456789abcdef)" || got.ReportedAt == nil {
		t.Errorf("status.agent = %+v, want version v1.4.0, last error PermissionDenied with its message, and a report time", got)
	}
}
