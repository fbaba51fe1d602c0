package crds

import (
	"testing"
)

func TestAllDecodesEveryGeneratedCRD(t *testing.T) {
	crds, err := All()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"workloadautoregistrations.runtime.onboarding.tetrate.io": "WorkloadAutoRegistration",
		"onboardingpolicies.authorization.onboarding.tetrate.io":  "OnboardingPolicy",
		"workloadgrouprollouts.runtime.onboarding.tetrate.io":     "WorkloadGroupRollout",
	}
	if len(crds) != len(want) {
		t.Fatalf("got %d CRDs, want %d", len(crds), len(want))
	}
	for _, crd := range crds {
		kind, ok := want[crd.Name]
		if !ok {
			t.Errorf("unexpected CRD %q", crd.Name)
			continue
		}
		if crd.Spec.Names.Kind != kind {
			t.Errorf("%s: kind %q, want %q", crd.Name, crd.Spec.Names.Kind, kind)
		}
		if crd.Spec.Scope != "Namespaced" {
			t.Errorf("%s: scope %q, want Namespaced", crd.Name, crd.Spec.Scope)
		}
	}
}
