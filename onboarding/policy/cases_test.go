package policy

import (
	"strings"
	"testing"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// evaluateCase is one row of a platform's Evaluate table: the policies, the
// workload's identity, and what the decision must say.
type evaluateCase struct {
	name        string
	policies    []authorizationv1alpha1.OnboardingPolicy
	id          runtimev1alpha1.WorkloadIdentity
	wantAllowed bool
	wantMessage []string // each a part of the decision's message
}

// runEvaluateCases evaluates each case for g and checks whether the
// decision allows it and what its message says.
func runEvaluateCases(t *testing.T, g GroupRef, cases []evaluateCase) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			d := Evaluate(tt.policies, g, tt.id)
			if d.Allowed != tt.wantAllowed {
				t.Errorf("allowed %v, want %v: %s", d.Allowed, tt.wantAllowed, d.Message())
			}
			for _, w := range tt.wantMessage {
				if !strings.Contains(d.Message(), w) {
					t.Errorf("message %q does not say %q", d.Message(), w)
				}
			}
		})
	}
}
