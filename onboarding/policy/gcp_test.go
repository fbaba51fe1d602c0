package policy

import (
	"testing"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// gceID is a verified Compute Engine identity.
func gceID(project, zone, name, sa string) runtimev1alpha1.WorkloadIdentity {
	return runtimev1alpha1.WorkloadIdentity{GCP: &runtimev1alpha1.GCPIdentity{
		ProjectID: project, ProjectNumber: "123456789012", Zone: zone,
		InstanceID: "5180367924151823417", InstanceName: name, ServiceAccount: sa,
	}}
}

const gcpPolicy = `
metadata: {name: gce-ratings, namespace: bookinfo}
spec:
  allow:
  - workloads:
    - gcp:
        projects: [embark-test]
        zones: [us-central1-a, us-central1-b]
        serviceAccounts: [ratings@embark-test.iam.gserviceaccount.com]
        instanceNamePatterns: ['ratings-*']
    onboardTo: [{workloadGroupSelector: {matchLabels: {app: ratings}}}]
`

func TestEvaluateGCP(t *testing.T) {
	p := policyYAML(t, gcpPolicy)
	anyProject := policyYAML(t, `
metadata: {name: gce-empty, namespace: bookinfo}
spec:
  allow:
  - workloads: [{gcp: {projects: []}}]
    onboardTo: [{workloadGroupSelector: {}}]
`)
	awsOnly, _ := seedPolicies(t)
	ratings := group("bookinfo", "ratings", "app", "ratings")
	const sa = "ratings@embark-test.iam.gserviceaccount.com"
	runEvaluateCases(t, ratings, []evaluateCase{
		{
			name: "instance of the project, zone, account and name joins", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id: gceID("embark-test", "us-central1-a", "ratings-1", sa), wantAllowed: true,
			wantMessage: []string{"gcp project embark-test zone us-central1-a instance ratings-1 (5180367924151823417) service account " + sa + " is allowed"},
		},
		{
			name: "another project is refused", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id:          gceID("other-project", "us-central1-a", "ratings-1", sa),
			wantMessage: []string{"project other-project not in [embark-test]"},
		},
		{
			name: "another zone is refused", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id:          gceID("embark-test", "europe-west1-b", "ratings-1", sa),
			wantMessage: []string{"zone europe-west1-b not in [us-central1-a us-central1-b]"},
		},
		{
			name: "another service account is refused", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id:          gceID("embark-test", "us-central1-a", "ratings-1", "default@embark-test.iam.gserviceaccount.com"),
			wantMessage: []string{"service account default@embark-test.iam.gserviceaccount.com not in [" + sa + "]"},
		},
		{
			name: "a name outside the patterns is refused", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id:          gceID("embark-test", "us-central1-a", "reviews-1", sa),
			wantMessage: []string{"instance name reviews-1 matches none of [ratings-*]"},
		},
		{
			name: "projects: [] matches nothing", policies: []authorizationv1alpha1.OnboardingPolicy{anyProject},
			id:          gceID("embark-test", "us-central1-a", "ratings-1", sa),
			wantMessage: []string{"project embark-test not in []"},
		},
		{
			name: "an aws rule does not allow a gce instance", policies: []authorizationv1alpha1.OnboardingPolicy{awsOnly},
			id:          gceID("embark-test", "us-central1-a", "ratings-1", sa),
			wantMessage: []string{"rule matches aws workloads, identity is gcp"},
		},
		{
			name: "a gcp rule does not allow an EC2 instance", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id:          ec2("123456789012", "us-east-2", "us-east-2a", ""),
			wantMessage: []string{"rule matches gcp workloads, identity is aws"},
		},
	})
}

func TestMatchGCPMalformedMatcher(t *testing.T) {
	m := authorizationv1alpha1.WorkloadMatcher{
		GCP: &authorizationv1alpha1.GCPMatcher{Projects: []string{"embark-test"}},
		JWT: &authorizationv1alpha1.JWTMatcher{Issuer: "https://idp.example.com"},
	}
	if f := matchWorkload(&m, gceID("embark-test", "us-central1-a", "ratings-1", "a@b.c")); f != failMalformed {
		t.Errorf("matcher with gcp and jwt: %b, want failMalformed", f)
	}
}
