package policy

import (
	"strings"
	"testing"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

const (
	azTenant = "72f988bf-86f1-41af-91ab-2d7cd011db47"
	azSub    = "0b1f6471-1bf0-4dda-aec3-cb9272f09590"
	azOther  = "11111111-2222-3333-4444-555555555555"
)

// azureID is a verified Azure VM identity.
func azureID(tenant, sub, group, name string) runtimev1alpha1.WorkloadIdentity {
	return runtimev1alpha1.WorkloadIdentity{Azure: &runtimev1alpha1.AzureIdentity{
		TenantID: tenant, SubscriptionID: sub, ResourceGroup: group, VMName: name,
		PrincipalID: "9b5a7f2e-3c1d-4e8f-a6b2-0d4c8e1f7a93",
	}}
}

const azurePolicy = `
metadata: {name: azure-ratings, namespace: bookinfo}
spec:
  allow:
  - workloads:
    - azure:
        tenants: [` + azTenant + `]
        subscriptions: [` + azSub + `]
        resourceGroups: [Embark-RG]
    onboardTo: [{workloadGroupSelector: {matchLabels: {app: ratings}}}]
`

func TestEvaluateAzure(t *testing.T) {
	p := policyYAML(t, azurePolicy)
	emptyGroups := policyYAML(t, `
metadata: {name: azure-empty, namespace: bookinfo}
spec:
  allow:
  - workloads: [{azure: {tenants: [`+azTenant+`], subscriptions: [`+azSub+`], resourceGroups: []}}]
    onboardTo: [{workloadGroupSelector: {}}]
`)
	gcpOnly := policyYAML(t, gcpPolicy)
	ratings := group("bookinfo", "ratings", "app", "ratings")
	tests := []struct {
		name        string
		policies    []authorizationv1alpha1.OnboardingPolicy
		id          runtimev1alpha1.WorkloadIdentity
		wantAllowed bool
		wantMessage []string
	}{
		{
			name: "VM of the tenant, subscription and resource group joins (resource group without case)", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id: azureID(azTenant, azSub, "embark-rg", "ratings-1"), wantAllowed: true,
			wantMessage: []string{"azure tenant " + azTenant + " subscription " + azSub + " resource group embark-rg vm ratings-1 (principal 9b5a7f2e-3c1d-4e8f-a6b2-0d4c8e1f7a93) is allowed"},
		},
		{
			name: "another tenant is refused", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id:          azureID(azOther, azSub, "embark-rg", "ratings-1"),
			wantMessage: []string{"tenant " + azOther + " not in [" + azTenant + "]"},
		},
		{
			name: "another subscription is refused", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id:          azureID(azTenant, azOther, "embark-rg", "ratings-1"),
			wantMessage: []string{"subscription " + azOther + " not in [" + azSub + "]"},
		},
		{
			name: "another resource group is refused", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id:          azureID(azTenant, azSub, "other-rg", "ratings-1"),
			wantMessage: []string{"resource group other-rg not in [Embark-RG]"},
		},
		{
			name: "resourceGroups: [] matches nothing", policies: []authorizationv1alpha1.OnboardingPolicy{emptyGroups},
			id:          azureID(azTenant, azSub, "embark-rg", "ratings-1"),
			wantMessage: []string{"an empty list (resourceGroups: []) matches nothing"},
		},
		{
			name: "a gcp rule does not allow an Azure VM", policies: []authorizationv1alpha1.OnboardingPolicy{gcpOnly},
			id:          azureID(azTenant, azSub, "embark-rg", "ratings-1"),
			wantMessage: []string{"rule matches gcp workloads, identity is azure"},
		},
		{
			name: "an azure rule does not allow a GCE instance", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id:          gceID("embark-test", "us-central1-a", "ratings-1", "a@embark-test.iam.gserviceaccount.com"),
			wantMessage: []string{"rule matches azure workloads, identity is gcp"},
		},
		{
			name: "no policy: denied by default", policies: nil,
			id: azureID(azTenant, azSub, "embark-rg", "ratings-1"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Evaluate(tt.policies, ratings, tt.id)
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

func TestMatchAzureMalformedMatcher(t *testing.T) {
	m := authorizationv1alpha1.WorkloadMatcher{
		Azure: &authorizationv1alpha1.AzureMatcher{Tenants: []string{azTenant}, Subscriptions: []string{azSub}},
		GCP:   &authorizationv1alpha1.GCPMatcher{Projects: []string{"embark-test"}},
	}
	if f := matchWorkload(&m, azureID(azTenant, azSub, "embark-rg", "ratings-1")); f != failMalformed {
		t.Errorf("matcher with azure and gcp: %b, want failMalformed", f)
	}
}
