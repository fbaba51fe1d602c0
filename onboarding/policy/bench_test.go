package policy

import (
	"fmt"
	"testing"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// benchPolicies returns n policies shaped like the narrow example policy,
// each for its own account; only the last one allows allowedAccount().
func benchPolicies(n int) []authorizationv1alpha1.OnboardingPolicy {
	out := make([]authorizationv1alpha1.OnboardingPolicy, n)
	for i := range out {
		p := &out[i]
		p.Name = fmt.Sprintf("policy-%04d", i)
		p.Namespace = "bookinfo"
		p.Spec.Allow = []authorizationv1alpha1.AllowRule{{
			Workloads: []authorizationv1alpha1.WorkloadMatcher{{AWS: &authorizationv1alpha1.AWSMatcher{
				Partitions: []authorizationv1alpha1.AWSPartition{"aws"},
				Accounts:   []string{fmt.Sprintf("%012d", 100000000000+i)},
				Regions:    []string{"us-east-2"},
				Zones:      []string{"us-east-2a", "us-east-2b"},
				EC2:        &authorizationv1alpha1.EC2Matcher{IAMRoleNames: []string{"ratings-role"}},
			}}},
			OnboardTo: []authorizationv1alpha1.OnboardTarget{{}},
		}}
		p.Spec.Allow[0].OnboardTo[0].WorkloadGroupSelector.MatchLabels = map[string]string{"app": "ratings"}
	}
	return out
}

// BenchmarkEvaluate measures Evaluate over 1, 10 and 100 policies of the
// group's namespace: "allowed" is allowed by the last policy in name order
// (every policy is evaluated), "denied" is allowed by none (every policy is
// evaluated and the closest rules are described), "denied+message" also
// renders the denial message.
func BenchmarkEvaluate(b *testing.B) {
	group := GroupRef{Namespace: "bookinfo", Name: "ratings", Labels: map[string]string{"app": "ratings", "class": "vm"}}
	for _, n := range []int{1, 10, 100} {
		policies := benchPolicies(n)
		allowed := ec2(fmt.Sprintf("%012d", 100000000000+n-1), "us-east-2", "us-east-2b", "ratings-role")
		denied := ec2("999999999999", "us-east-2", "us-east-2b", "ratings-role")
		cases := []struct {
			name        string
			id          runtimev1alpha1.WorkloadIdentity
			message     bool
			wantAllowed bool
		}{
			{name: "allowed", id: allowed, wantAllowed: true},
			{name: "denied", id: denied},
			{name: "denied+message", id: denied, message: true},
		}
		for _, c := range cases {
			b.Run(fmt.Sprintf("policies=%d/%s", n, c.name), func(b *testing.B) {
				if d := Evaluate(policies, group, c.id); d.Allowed != c.wantAllowed {
					b.Fatalf("Allowed = %v, want %v: %s", d.Allowed, c.wantAllowed, d.Message())
				}
				b.ReportAllocs()
				for b.Loop() {
					d := Evaluate(policies, group, c.id)
					if c.message {
						_ = d.Message()
					}
				}
			})
		}
	}
}
