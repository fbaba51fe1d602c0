package policy

import (
	"testing"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// ecsID is a verified ECS task identity; confirmed says the ECS API
// confirmed it.
func ecsID(account, zone, cluster, role string, confirmed bool) runtimev1alpha1.WorkloadIdentity {
	return runtimev1alpha1.WorkloadIdentity{ECS: &runtimev1alpha1.ECSIdentity{
		Partition: "aws", Account: account, Region: "us-east-2", Zone: zone, Cluster: cluster,
		TaskARN: "arn:aws:ecs:us-east-2:" + account + ":task/" + cluster + "/0123abcd", TaskID: "0123abcd",
		TaskRole: role, Family: "ratings", Revision: "3", TaskConfirmed: confirmed,
	}}
}

const ecsPolicy = `
metadata: {name: ecs-ratings, namespace: bookinfo}
spec:
  allow:
  - workloads:
    - ecs:
        accounts: ["123456789012"]
        regions: [us-east-2]
        zones: [us-east-2a, us-east-2b]
        clusters: [prod]
        taskRoles: [ratings-task]
    onboardTo: [{workloadGroupSelector: {matchLabels: {app: ratings}}}]
`

func TestEvaluateECS(t *testing.T) {
	p := policyYAML(t, ecsPolicy)
	rolesOnly := policyYAML(t, `
metadata: {name: ecs-roles, namespace: bookinfo}
spec:
  allow:
  - workloads: [{ecs: {accounts: ["123456789012"], taskRoles: [ratings-task]}}]
    onboardTo: [{workloadGroupSelector: {}}]
`)
	noAccount := policyYAML(t, `
metadata: {name: ecs-empty, namespace: bookinfo}
spec:
  allow:
  - workloads: [{ecs: {accounts: []}}]
    onboardTo: [{workloadGroupSelector: {}}]
`)
	awsOnly, _ := seedPolicies(t)
	ratings := group("bookinfo", "ratings", "app", "ratings")
	const acct = "123456789012"
	runEvaluateCases(t, ratings, []evaluateCase{
		{
			name: "a confirmed task of the account, zone, cluster and role joins", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id: ecsID(acct, "us-east-2b", "prod", "ratings-task", true), wantAllowed: true,
			wantMessage: []string{"ecs partition aws account 123456789012 region us-east-2 zone us-east-2b cluster prod task 0123abcd task role ratings-task is allowed"},
		},
		{
			name: "an unconfirmed task is refused by a rule naming clusters", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id:          ecsID(acct, "us-east-2b", "prod", "ratings-task", false),
			wantMessage: []string{"task not confirmed by the ECS API"},
		},
		{
			name: "an unconfirmed task joins by account and role", policies: []authorizationv1alpha1.OnboardingPolicy{rolesOnly},
			id: ecsID(acct, "us-east-2b", "prod", "ratings-task", false), wantAllowed: true,
		},
		{
			name: "another account is refused", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id:          ecsID("999999999999", "us-east-2b", "prod", "ratings-task", true),
			wantMessage: []string{"account 999999999999 not in [123456789012]"},
		},
		{
			name: "another cluster is refused", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id:          ecsID(acct, "us-east-2b", "dev", "ratings-task", true),
			wantMessage: []string{"cluster dev not in [prod]"},
		},
		{
			name: "another zone is refused", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id:          ecsID(acct, "us-east-2c", "prod", "ratings-task", true),
			wantMessage: []string{"zone us-east-2c not in [us-east-2a us-east-2b]"},
		},
		{
			name: "another task role is refused", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id:          ecsID(acct, "us-east-2b", "prod", "admin", true),
			wantMessage: []string{"task role admin not in [ratings-task]"},
		},
		{
			name: "accounts: [] matches nothing", policies: []authorizationv1alpha1.OnboardingPolicy{noAccount},
			id:          ecsID(acct, "us-east-2b", "prod", "ratings-task", true),
			wantMessage: []string{"account 123456789012 not in []"},
		},
		{
			name: "an aws rule does not allow an ECS task", policies: []authorizationv1alpha1.OnboardingPolicy{awsOnly},
			id:          ecsID(acct, "us-east-2b", "prod", "ratings-task", true),
			wantMessage: []string{"rule matches aws workloads, identity is ecs"},
		},
		{
			name: "an ecs rule does not allow an EC2 instance", policies: []authorizationv1alpha1.OnboardingPolicy{p},
			id:          ec2(acct, "us-east-2", "us-east-2a", ""),
			wantMessage: []string{"rule matches ecs tasks, identity is aws"},
		},
	})
}
