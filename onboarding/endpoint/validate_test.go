package endpoint

import (
	"strings"
	"testing"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
)

func TestValidateRegisterRequestLastError(t *testing.T) {
	for _, tc := range []struct {
		name string
		last *onboardingv1alpha1.AgentError
		want string // "" when valid
	}{
		{name: "none"},
		{name: "gRPC code", last: &onboardingv1alpha1.AgentError{Reason: "PermissionDenied", Message: "not authorized to onboard (request id 0123456789abcdef)"}},
		{name: "reason only", last: &onboardingv1alpha1.AgentError{Reason: "PlatformCredential"}},
		{name: "message of 256 bytes", last: &onboardingv1alpha1.AgentError{Reason: "Unavailable", Message: strings.Repeat("é", 128)}},
		{name: "tab is kept out", last: &onboardingv1alpha1.AgentError{Reason: "Unavailable", Message: "a\tb"}, want: "last_error.message: control character U+0009"},
		{name: "message of 257 bytes", last: &onboardingv1alpha1.AgentError{Reason: "Unavailable", Message: strings.Repeat("x", 257)}, want: "last_error.message: 257 bytes"},
		{name: "escape", last: &onboardingv1alpha1.AgentError{Reason: "Unavailable", Message: "\x1b[31m"}, want: "last_error.message: control character U+001B"},
		{name: "C1 control", last: &onboardingv1alpha1.AgentError{Reason: "Unavailable", Message: "a\u009bb"}, want: "last_error.message: control character"},
		{name: "bidirectional override", last: &onboardingv1alpha1.AgentError{Reason: "Unavailable", Message: "a\u202eb"}, want: "last_error.message: control character U+202E"},
		{name: "line separator", last: &onboardingv1alpha1.AgentError{Reason: "Unavailable", Message: "a\u2028b"}, want: "last_error.message: control character U+2028"},
		{name: "not UTF-8", last: &onboardingv1alpha1.AgentError{Reason: "Unavailable", Message: "\xff"}, want: "last_error.message: not UTF-8"},
		{name: "empty reason", last: &onboardingv1alpha1.AgentError{Message: "x"}, want: "last_error.reason"},
		{name: "reason starts with a digit", last: &onboardingv1alpha1.AgentError{Reason: "5xx"}, want: "last_error.reason"},
		{name: "reason with a space", last: &onboardingv1alpha1.AgentError{Reason: "Permission Denied"}, want: "last_error.reason"},
		{name: "reason of 65 characters", last: &onboardingv1alpha1.AgentError{Reason: "R" + strings.Repeat("r", 64)}, want: "last_error.reason"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateRegisterRequest(&onboardingv1alpha1.RegisterRequest{
				Addresses: []*onboardingv1alpha1.HostAddress{{Ip: "10.0.0.1", Type: "VPC"}}, LastError: tc.last,
			})
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// The versions a VM reports are shown in its registration too (kubectl get
// war -o wide, describe): what a terminal interprets is refused, naming the
// field.
func TestValidateRegisterRequestVersions(t *testing.T) {
	for _, tc := range []struct {
		name           string
		agent, sidecar string
		want           string // "" when valid
	}{
		{name: "release versions", agent: "v0.2.0", sidecar: "1.31.0"},
		{name: "empty"},
		{name: "escape in the agent version", agent: "v1\x1b[2J", want: "agent_version: control character U+001B"},
		{name: "newline in the sidecar version", sidecar: "1.31\nforged", want: "istio_sidecar_version: control character U+000A"},
		{name: "bidirectional override", agent: "v1\u202e", want: "agent_version: control character U+202E"},
		{name: "too long", agent: strings.Repeat("v", 1000), want: "agent_version: longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateRegisterRequest(&onboardingv1alpha1.RegisterRequest{
				Addresses: []*onboardingv1alpha1.HostAddress{{Ip: "10.0.0.1", Type: "VPC"}}, AgentVersion: tc.agent, IstioSidecarVersion: tc.sidecar,
			})
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("err = %v, want one naming %q", err, tc.want)
			}
		})
	}
}
