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
	runEvaluateCases(t, ratings, []evaluateCase{
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
	})
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

// confirmedAzureID is an Azure VM identity Azure Resource Manager
// confirmed in location.
func confirmedAzureID(location string) runtimev1alpha1.WorkloadIdentity {
	id := azureID(azTenant, azSub, "embark-rg", "ratings-1")
	id.Azure.Location, id.Azure.VMID, id.Azure.VMConfirmed = location, "13f56399-bd52-4150-9748-7190aae1ff21", true
	return id
}

// A rule naming locations admits only VMs Resource Manager confirmed in one
// of them; an unconfirmed VM is denied, and the decision says a
// confirmation could change it only when nothing else fails.
func TestEvaluateAzureLocations(t *testing.T) {
	p := policyYAML(t, `
metadata: {name: azure-west, namespace: bookinfo}
spec:
  allow:
  - workloads: [{azure: {tenants: [`+azTenant+`], subscriptions: [`+azSub+`], locations: [WestEurope, northeurope]}}]
    onboardTo: [{workloadGroupSelector: {matchLabels: {app: ratings}}}]
`)
	empty := policyYAML(t, `
metadata: {name: azure-empty, namespace: bookinfo}
spec:
  allow:
  - workloads: [{azure: {tenants: [`+azTenant+`], subscriptions: [`+azSub+`], locations: []}}]
    onboardTo: [{workloadGroupSelector: {}}]
`)
	ratings := group("bookinfo", "ratings", "app", "ratings")
	for _, tt := range []struct {
		name                  string
		policy                authorizationv1alpha1.OnboardingPolicy
		id                    runtimev1alpha1.WorkloadIdentity
		wantAllowed           bool
		wantNeedsConfirmation bool
		wantMessage           string
	}{
		{name: "confirmed in a listed location (without case)", policy: p, id: confirmedAzureID("westeurope"), wantAllowed: true,
			wantMessage: "location westeurope is allowed"},
		{name: "confirmed in another location", policy: p, id: confirmedAzureID("eastus"),
			wantMessage: "location eastus not in [WestEurope northeurope]"},
		{name: "not confirmed (no vmCheck)", policy: p, id: azureID(azTenant, azSub, "embark-rg", "ratings-1"), wantNeedsConfirmation: true,
			wantMessage: "VM not confirmed by Azure Resource Manager (the rule names locations; the endpoint needs identity.azure.vmCheck)"},
		{name: "not confirmed, and of another subscription", policy: p, id: azureID(azTenant, azOther, "embark-rg", "ratings-1"),
			wantMessage: "subscription " + azOther + " not in"},
		{name: "locations: [] matches nothing", policy: empty, id: confirmedAzureID("westeurope"),
			wantMessage: "an empty list (locations: []) matches nothing"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := Evaluate([]authorizationv1alpha1.OnboardingPolicy{tt.policy}, ratings, tt.id)
			if d.Allowed != tt.wantAllowed || d.NeedsConfirmation != tt.wantNeedsConfirmation {
				t.Errorf("allowed %v, needs confirmation %v; want %v, %v: %s", d.Allowed, d.NeedsConfirmation, tt.wantAllowed, tt.wantNeedsConfirmation, d.Message())
			}
			if !strings.Contains(d.Message(), tt.wantMessage) {
				t.Errorf("message %q does not say %q", d.Message(), tt.wantMessage)
			}
		})
	}
}
