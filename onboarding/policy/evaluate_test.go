package policy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"sigs.k8s.io/yaml"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// seedDir holds the example objects, the API package's test data.
const seedDir = "../../api/crds/testdata/seed004"

const (
	anyPolicy    = "allow-any-aws-ec2-instance-in-given-accounts"
	narrowPolicy = "allow-narrow-subset-of-aws-ec2-instances"
	instanceID   = "i-1234567890abcdef0"
)

// decodeYAML decodes one YAML document into out.
func decodeYAML(t testing.TB, data []byte, out any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(data, out); err != nil {
		t.Fatalf("decode YAML: %v", err)
	}
}

func loadSeed(t testing.TB, file string, out any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(seedDir, file))
	if err != nil {
		t.Fatalf("read example: %v", err)
	}
	decodeYAML(t, data, out)
}

// seedPolicies returns the two example OnboardingPolicies (namespace bookinfo).
func seedPolicies(t testing.TB) (anyEC2, narrow authorizationv1alpha1.OnboardingPolicy) {
	t.Helper()
	loadSeed(t, "policy-any-ec2-in-accounts.yaml", &anyEC2)
	loadSeed(t, "policy-narrow-ec2-subset.yaml", &narrow)
	if anyEC2.Name != anyPolicy || narrow.Name != narrowPolicy {
		t.Fatalf("seed policies are named %q and %q", anyEC2.Name, narrow.Name)
	}
	return anyEC2, narrow
}

// seedGroup returns the example WorkloadGroup bookinfo/ratings (label app=ratings).
func seedGroup(t testing.TB) *networkingv1.WorkloadGroup {
	t.Helper()
	wg := &networkingv1.WorkloadGroup{}
	loadSeed(t, "workloadgroup.yaml", wg)
	return wg
}

func policyYAML(t testing.TB, doc string) authorizationv1alpha1.OnboardingPolicy {
	t.Helper()
	var p authorizationv1alpha1.OnboardingPolicy
	decodeYAML(t, []byte(doc), &p)
	return p
}

// ec2 is a verified EC2 identity in partition aws; role "" = no proven role.
func ec2(account, region, zone, role string) runtimev1alpha1.WorkloadIdentity {
	return runtimev1alpha1.WorkloadIdentity{AWS: &runtimev1alpha1.AWSIdentity{
		Partition: "aws", Account: account, Region: region, Zone: zone,
		EC2: &runtimev1alpha1.EC2Identity{InstanceID: instanceID, IAMRole: role},
	}}
}

func withPartition(id runtimev1alpha1.WorkloadIdentity, partition string) runtimev1alpha1.WorkloadIdentity {
	id.AWS.Partition = partition
	return id
}

func jwtID(issuer, subject string, attrs map[string]string) runtimev1alpha1.WorkloadIdentity {
	return runtimev1alpha1.WorkloadIdentity{JWT: &runtimev1alpha1.JWTIdentity{
		Issuer: issuer, ShortName: "idp", Subject: subject, Attributes: attrs,
	}}
}

func group(ns, name string, kv ...string) GroupRef {
	g := GroupRef{Namespace: ns, Name: name}
	if len(kv) > 0 {
		g.Labels = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			g.Labels[kv[i]] = kv[i+1]
		}
	}
	return g
}

func inNamespace(p authorizationv1alpha1.OnboardingPolicy, ns string) authorizationv1alpha1.OnboardingPolicy {
	p = *p.DeepCopy()
	p.Namespace = ns
	return p
}

const onPremPolicy = `
apiVersion: authorization.onboarding.tetrate.io/v1alpha1
kind: OnboardingPolicy
metadata:
  name: allow-on-prem-hosts
  namespace: bookinfo
spec:
  allow:
  - workloads:
    - jwt:
        issuer: https://idp.example.com
        subjects: [host-1, host-2]
        attributes:
        - name: env
          values: [prod, staging]
        - name: team
          values: [ratings]
    onboardTo:
    - workloadGroupSelector:
        matchExpressions:
        - {key: app, operator: In, values: [ratings, reviews]}
        - {key: tier, operator: NotIn, values: [legacy]}
`

const anySubjectPolicy = `
apiVersion: authorization.onboarding.tetrate.io/v1alpha1
kind: OnboardingPolicy
metadata:
  name: allow-any-subject
  namespace: bookinfo
spec:
  allow:
  - workloads:
    - jwt:
        issuer: https://idp.example.com
    onboardTo:
    - workloadGroupSelector: {}
`

const existsPolicy = `
apiVersion: authorization.onboarding.tetrate.io/v1alpha1
kind: OnboardingPolicy
metadata:
  name: allow-vm-groups
  namespace: bookinfo
spec:
  allow:
  - workloads:
    - aws:
        accounts: ['123456789012']
    onboardTo:
    - workloadGroupSelector:
        matchExpressions:
        - {key: vm, operator: Exists}
        - {key: deprecated, operator: DoesNotExist}
`

const twoTargetsPolicy = `
apiVersion: authorization.onboarding.tetrate.io/v1alpha1
kind: OnboardingPolicy
metadata:
  name: allow-two-groups
  namespace: bookinfo
spec:
  allow:
  - workloads:
    - aws:
        accounts: ['123456789012']
    onboardTo:
    - workloadGroupSelector:
        matchLabels: {app: ratings}
    - workloadGroupSelector:
        matchLabels: {app: reviews}
`

const twoMatchersPolicy = `
apiVersion: authorization.onboarding.tetrate.io/v1alpha1
kind: OnboardingPolicy
metadata:
  name: multi
  namespace: bookinfo
spec:
  allow:
  - workloads:
    - jwt:
        issuer: https://idp.example.com
    - aws:
        accounts: ['123456789012']
        zones: [us-east-2b]
    onboardTo:
    - workloadGroupSelector: {}
`

// brokenSelectorPolicy sorts before the seed policies.
const brokenSelectorPolicy = `
apiVersion: authorization.onboarding.tetrate.io/v1alpha1
kind: OnboardingPolicy
metadata:
  name: a-broken-selector
  namespace: bookinfo
spec:
  allow:
  - workloads:
    - aws:
        accounts: ['123456789012']
    onboardTo:
    - workloadGroupSelector:
        matchExpressions:
        - {key: app, operator: Near, values: [ratings]}
`

const badLabelValuePolicy = `
apiVersion: authorization.onboarding.tetrate.io/v1alpha1
kind: OnboardingPolicy
metadata:
  name: bad-label-value
  namespace: bookinfo
spec:
  allow:
  - workloads:
    - aws:
        accounts: ['123456789012']
    onboardTo:
    - workloadGroupSelector:
        matchLabels: {app: "not a label value!"}
`

func TestEvaluate(t *testing.T) {
	anyEC2, narrow := seedPolicies(t)
	ratings := GroupRefOf(seedGroup(t))
	details := group("bookinfo", "details", "app", "details")
	reviews := group("bookinfo", "reviews", "app", "reviews", "tier", "web")
	unlabelled := group("bookinfo", "legacy")
	onPrem := policyYAML(t, onPremPolicy)
	anySubject := policyYAML(t, anySubjectPolicy)
	exists := policyYAML(t, existsPolicy)
	twoTargets := policyYAML(t, twoTargetsPolicy)
	twoMatchers := policyYAML(t, twoMatchersPolicy)
	broken := policyYAML(t, brokenSelectorPolicy)
	badLabel := policyYAML(t, badLabelValuePolicy)
	neither := policyYAML(t, `
metadata: {name: neither, namespace: bookinfo}
spec:
  allow:
  - workloads: [{}]
    onboardTo: [{workloadGroupSelector: {}}]
`)
	everything := policyYAML(t, `
metadata: {name: allow-everything, namespace: reviews}
spec:
  allow:
  - workloads: [{aws: {accounts: ['999999999999']}}]
    onboardTo: [{workloadGroupSelector: {}}]
`)
	prodHost := map[string]string{"env": "prod", "team": "ratings"}
	const idp = "https://idp.example.com"

	tests := []struct {
		name     string
		policies []authorizationv1alpha1.OnboardingPolicy
		group    GroupRef
		id       runtimev1alpha1.WorkloadIdentity

		wantAllowed           bool
		wantAllowedBy         RuleRef
		wantPolicies          int
		wantClosest           []RuleRef
		wantMessage           []string
		wantNotInMessage      []string
		wantNeedsIAMRoleProof bool
		wantInvalidSelectors  int
	}{
		// First example: any EC2 instance of two accounts, any group.
		{
			name:     "seed any-ec2: instance of the first account joins",
			policies: []authorizationv1alpha1.OnboardingPolicy{anyEC2},
			group:    ratings, id: ec2("123456789012", "us-east-2", "us-east-2a", ""),
			wantAllowed: true, wantAllowedBy: RuleRef{anyPolicy, 0}, wantPolicies: 1,
			wantMessage: []string{"aws partition aws account 123456789012 region us-east-2 zone us-east-2a instance i-1234567890abcdef0 is allowed to join WorkloadGroup bookinfo/ratings by policy " + anyPolicy + "/rule 0"},
		},
		{
			name:     "seed any-ec2: second account, any region, group without labels",
			policies: []authorizationv1alpha1.OnboardingPolicy{anyEC2},
			group:    unlabelled, id: ec2("234567890123", "eu-west-1", "eu-west-1a", "some-role"),
			wantAllowed: true, wantAllowedBy: RuleRef{anyPolicy, 0}, wantPolicies: 1,
		},
		{
			name:     "seed any-ec2: selector {} selects a group with other labels",
			policies: []authorizationv1alpha1.OnboardingPolicy{anyEC2},
			group:    details, id: ec2("123456789012", "us-east-2", "us-east-2b", ""),
			wantAllowed: true, wantAllowedBy: RuleRef{anyPolicy, 0}, wantPolicies: 1,
		},
		{
			name:     "seed any-ec2: other account",
			policies: []authorizationv1alpha1.OnboardingPolicy{anyEC2},
			group:    ratings, id: ec2("999999999999", "us-east-2", "us-east-2b", ""),
			wantPolicies: 1, wantClosest: []RuleRef{{anyPolicy, 0}},
			wantMessage: []string{
				"aws partition aws account 999999999999 region us-east-2 zone us-east-2b instance i-1234567890abcdef0 is not authorized to join WorkloadGroup bookinfo/ratings",
				"no rule of the 1 OnboardingPolicy in namespace bookinfo allows it",
				"closest: policy " + anyPolicy + "/rule 0: account 999999999999 not in [123456789012 234567890123]",
			},
		},
		{
			name:     "seed any-ec2: AWS identity that is not an EC2 instance",
			policies: []authorizationv1alpha1.OnboardingPolicy{anyEC2},
			group:    ratings,
			id: runtimev1alpha1.WorkloadIdentity{AWS: &runtimev1alpha1.AWSIdentity{
				Partition: "aws", Account: "123456789012", Region: "us-east-2", Zone: "us-east-2b",
			}},
			wantPolicies: 1, wantClosest: []RuleRef{{anyPolicy, 0}},
			wantMessage: []string{"policy " + anyPolicy + "/rule 0: not an EC2 instance (rule requires ec2)"},
		},
		{
			name:     "seed any-ec2: policy of another namespace does not apply",
			policies: []authorizationv1alpha1.OnboardingPolicy{anyEC2},
			group:    group("reviews", "ratings", "app", "ratings"), id: ec2("123456789012", "us-east-2", "us-east-2b", ""),
			wantMessage:      []string{"is not authorized to join WorkloadGroup reviews/ratings: no OnboardingPolicy in namespace reviews"},
			wantNotInMessage: []string{anyPolicy},
		},
		{
			name:  "no policies: denied by default",
			group: ratings, id: ec2("123456789012", "us-east-2", "us-east-2b", "ratings-role"),
			wantMessage: []string{"aws partition aws account 123456789012 region us-east-2 zone us-east-2b instance i-1234567890abcdef0 iam role ratings-role is not authorized to join WorkloadGroup bookinfo/ratings: no OnboardingPolicy in namespace bookinfo"},
		},
		// Second example: partition, account, region, zone, IAM role, app=ratings.
		{
			name:     "seed narrow: matching instance with proven role joins ratings",
			policies: []authorizationv1alpha1.OnboardingPolicy{narrow},
			group:    ratings, id: ec2("123456789012", "us-east-2", "us-east-2b", "ratings-role"),
			wantAllowed: true, wantAllowedBy: RuleRef{narrowPolicy, 0}, wantPolicies: 1,
		},
		{
			name:     "seed narrow: other zone",
			policies: []authorizationv1alpha1.OnboardingPolicy{narrow},
			group:    ratings, id: ec2("123456789012", "us-east-2", "us-east-2a", "ratings-role"),
			wantPolicies: 1, wantClosest: []RuleRef{{narrowPolicy, 0}},
			wantMessage:      []string{"closest: policy " + narrowPolicy + "/rule 0: zone us-east-2a not in [us-east-2b]"},
			wantNotInMessage: []string{"iam role not", "region us-east-2 not in", "not selected"},
		},
		{
			name:     "seed narrow: other region and zone",
			policies: []authorizationv1alpha1.OnboardingPolicy{narrow},
			group:    ratings, id: ec2("123456789012", "us-west-2", "us-west-2b", "ratings-role"),
			wantPolicies: 1, wantClosest: []RuleRef{{narrowPolicy, 0}},
			wantMessage: []string{"policy " + narrowPolicy + "/rule 0: region us-west-2 not in [us-east-2], zone us-west-2b not in [us-east-2b]"},
		},
		{
			name:     "seed narrow: other partition",
			policies: []authorizationv1alpha1.OnboardingPolicy{narrow},
			group:    ratings, id: withPartition(ec2("123456789012", "us-east-2", "us-east-2b", "ratings-role"), "aws-cn"),
			wantPolicies: 1, wantClosest: []RuleRef{{narrowPolicy, 0}},
			wantMessage:      []string{"aws partition aws-cn account", "policy " + narrowPolicy + "/rule 0: partition aws-cn not in [aws]"},
			wantNotInMessage: []string{"account 123456789012 not in"},
		},
		{
			name:     "seed narrow: other account",
			policies: []authorizationv1alpha1.OnboardingPolicy{narrow},
			group:    ratings, id: ec2("234567890123", "us-east-2", "us-east-2b", "ratings-role"),
			wantPolicies: 1, wantClosest: []RuleRef{{narrowPolicy, 0}},
			wantMessage: []string{"policy " + narrowPolicy + "/rule 0: account 234567890123 not in [123456789012]"},
		},
		{
			name:     "seed narrow: IAM role not proven",
			policies: []authorizationv1alpha1.OnboardingPolicy{narrow},
			group:    ratings, id: ec2("123456789012", "us-east-2", "us-east-2b", ""),
			wantPolicies: 1, wantClosest: []RuleRef{{narrowPolicy, 0}}, wantNeedsIAMRoleProof: true,
			wantMessage: []string{"policy " + narrowPolicy + "/rule 0: iam role not proven (policy requires one of [ratings-role])"},
		},
		{
			name:     "seed narrow: other IAM role",
			policies: []authorizationv1alpha1.OnboardingPolicy{narrow},
			group:    ratings, id: ec2("123456789012", "us-east-2", "us-east-2b", "details-role"),
			wantPolicies: 1, wantClosest: []RuleRef{{narrowPolicy, 0}},
			wantMessage: []string{"iam role details-role", "policy " + narrowPolicy + "/rule 0: iam role details-role not in [ratings-role]"},
		},
		{
			name:     "seed narrow: group labels not selected",
			policies: []authorizationv1alpha1.OnboardingPolicy{narrow},
			group:    details, id: ec2("123456789012", "us-east-2", "us-east-2b", "ratings-role"),
			wantPolicies: 1, wantClosest: []RuleRef{{narrowPolicy, 0}},
			wantMessage: []string{
				"is not authorized to join WorkloadGroup bookinfo/details",
				"policy " + narrowPolicy + "/rule 0: WorkloadGroup labels app=details not selected by matchLabels app=ratings",
			},
		},
		{
			name:     "seed narrow: role unproven, but the group is not selected either",
			policies: []authorizationv1alpha1.OnboardingPolicy{narrow},
			group:    details, id: ec2("123456789012", "us-east-2", "us-east-2b", ""),
			wantPolicies: 1, wantClosest: []RuleRef{{narrowPolicy, 0}}, wantNeedsIAMRoleProof: false,
			wantMessage: []string{"iam role not proven (policy requires one of [ratings-role]), WorkloadGroup labels app=details not selected by matchLabels app=ratings"},
		},
		{
			name:     "seed narrow: group without labels",
			policies: []authorizationv1alpha1.OnboardingPolicy{narrow},
			group:    unlabelled, id: ec2("123456789012", "us-east-2", "us-east-2b", "ratings-role"),
			wantPolicies: 1,
			wantMessage:  []string{"WorkloadGroup labels (none) not selected by matchLabels app=ratings"},
		},
		{
			name:     "seed narrow: JWT identity",
			policies: []authorizationv1alpha1.OnboardingPolicy{narrow},
			group:    ratings, id: jwtID(idp, "host-1", prodHost),
			wantPolicies: 1,
			wantMessage:  []string{"jwt issuer https://idp.example.com subject host-1 is not authorized", "rule 0: rule matches aws workloads, identity is jwt"},
		},
		// Both seed policies together.
		{
			name:     "seed both: any-ec2 allows an instance outside the narrow zone",
			policies: []authorizationv1alpha1.OnboardingPolicy{narrow, anyEC2},
			group:    ratings, id: ec2("234567890123", "us-east-2", "us-east-2a", ""),
			wantAllowed: true, wantAllowedBy: RuleRef{anyPolicy, 0}, wantPolicies: 2,
		},
		{
			name:     "seed both: first allowing rule in name order",
			policies: []authorizationv1alpha1.OnboardingPolicy{narrow, anyEC2},
			group:    ratings, id: ec2("123456789012", "us-east-2", "us-east-2b", "ratings-role"),
			wantAllowed: true, wantAllowedBy: RuleRef{anyPolicy, 0}, wantPolicies: 2,
		},
		{
			name:     "seed both: other account, both rules equally close",
			policies: []authorizationv1alpha1.OnboardingPolicy{narrow, anyEC2},
			group:    ratings, id: ec2("999999999999", "us-east-2", "us-east-2b", "ratings-role"),
			wantPolicies: 2, wantClosest: []RuleRef{{anyPolicy, 0}, {narrowPolicy, 0}},
			wantMessage: []string{
				"no rule of the 2 OnboardingPolicies in namespace bookinfo allows it; closest: " +
					"policy " + anyPolicy + "/rule 0: account 999999999999 not in [123456789012 234567890123]; " +
					"policy " + narrowPolicy + "/rule 0: account 999999999999 not in [123456789012]",
			},
		},
		{
			name:     "seed both: only the closest rule is listed",
			policies: []authorizationv1alpha1.OnboardingPolicy{narrow, anyEC2},
			group:    ratings,
			id: runtimev1alpha1.WorkloadIdentity{AWS: &runtimev1alpha1.AWSIdentity{
				Partition: "aws", Account: "234567890123", Region: "us-east-2", Zone: "us-east-2b",
			}},
			wantPolicies: 2, wantClosest: []RuleRef{{anyPolicy, 0}},
			wantMessage:      []string{"closest: policy " + anyPolicy + "/rule 0: not an EC2 instance (rule requires ec2)"},
			wantNotInMessage: []string{narrowPolicy},
		},
		{
			name:     "seed both: policies of other namespaces are ignored",
			policies: []authorizationv1alpha1.OnboardingPolicy{everything, inNamespace(anyEC2, "reviews"), narrow, anyEC2},
			group:    ratings, id: ec2("999999999999", "us-east-2", "us-east-2b", "ratings-role"),
			wantPolicies: 2, wantClosest: []RuleRef{{anyPolicy, 0}, {narrowPolicy, 0}},
			wantMessage:      []string{"no rule of the 2 OnboardingPolicies in namespace bookinfo"},
			wantNotInMessage: []string{"allow-everything"},
		},
		// JWT matcher and matchExpressions.
		{
			name:     "jwt: matching host joins ratings",
			policies: []authorizationv1alpha1.OnboardingPolicy{onPrem},
			group:    ratings, id: jwtID(idp, "host-1", prodHost),
			wantAllowed: true, wantAllowedBy: RuleRef{"allow-on-prem-hosts", 0}, wantPolicies: 1,
			wantMessage: []string{"jwt issuer https://idp.example.com subject host-1 is allowed to join WorkloadGroup bookinfo/ratings by policy allow-on-prem-hosts/rule 0"},
		},
		{
			name:     "jwt: matchExpressions In and NotIn select reviews",
			policies: []authorizationv1alpha1.OnboardingPolicy{onPrem},
			group:    reviews, id: jwtID(idp, "host-2", map[string]string{"env": "staging", "team": "ratings", "extra": "x"}),
			wantAllowed: true, wantAllowedBy: RuleRef{"allow-on-prem-hosts", 0}, wantPolicies: 1,
		},
		{
			name:     "jwt: other issuer",
			policies: []authorizationv1alpha1.OnboardingPolicy{onPrem},
			group:    ratings, id: jwtID("https://evil.example.com", "host-1", prodHost),
			wantPolicies:     1,
			wantMessage:      []string{"policy allow-on-prem-hosts/rule 0: issuer https://evil.example.com is not https://idp.example.com"},
			wantNotInMessage: []string{"subject host-1 not in", "attribute"},
		},
		{
			name:     "jwt: other subject",
			policies: []authorizationv1alpha1.OnboardingPolicy{onPrem},
			group:    ratings, id: jwtID(idp, "host-9", prodHost),
			wantPolicies: 1,
			wantMessage:  []string{"policy allow-on-prem-hosts/rule 0: subject host-9 not in [host-1 host-2]"},
		},
		{
			name:     "jwt: attribute missing",
			policies: []authorizationv1alpha1.OnboardingPolicy{onPrem},
			group:    ratings, id: jwtID(idp, "host-1", map[string]string{"env": "prod"}),
			wantPolicies:     1,
			wantMessage:      []string{"policy allow-on-prem-hosts/rule 0: attribute team missing (policy requires one of [ratings])"},
			wantNotInMessage: []string{"attribute env"},
		},
		{
			name:     "jwt: attribute with another value",
			policies: []authorizationv1alpha1.OnboardingPolicy{onPrem},
			group:    ratings, id: jwtID(idp, "host-1", map[string]string{"env": "dev", "team": "ratings"}),
			wantPolicies: 1,
			wantMessage:  []string{"policy allow-on-prem-hosts/rule 0: attribute env=dev not in [prod staging]"},
		},
		{
			name:     "jwt: subject, and both attributes wrong",
			policies: []authorizationv1alpha1.OnboardingPolicy{onPrem},
			group:    ratings, id: jwtID(idp, "host-3", map[string]string{"env": "dev"}),
			wantPolicies: 1,
			wantMessage:  []string{"subject host-3 not in [host-1 host-2], attribute env=dev not in [prod staging], attribute team missing (policy requires one of [ratings])"},
		},
		{
			name:     "jwt: matchExpressions In does not select details",
			policies: []authorizationv1alpha1.OnboardingPolicy{onPrem},
			group:    details, id: jwtID(idp, "host-1", prodHost),
			wantPolicies: 1,
			wantMessage:  []string{"policy allow-on-prem-hosts/rule 0: WorkloadGroup labels app=details not selected by matchExpressions app in (ratings,reviews),tier notin (legacy)"},
		},
		{
			name:     "jwt: matchExpressions NotIn excludes a legacy tier",
			policies: []authorizationv1alpha1.OnboardingPolicy{onPrem},
			group:    group("bookinfo", "old-ratings", "app", "ratings", "tier", "legacy"), id: jwtID(idp, "host-1", prodHost),
			wantPolicies: 1,
			wantMessage:  []string{"WorkloadGroup labels app=ratings,tier=legacy not selected by matchExpressions app in (ratings,reviews),tier notin (legacy)"},
		},
		{
			name:     "jwt: AWS identity against a JWT rule",
			policies: []authorizationv1alpha1.OnboardingPolicy{onPrem},
			group:    ratings, id: ec2("123456789012", "us-east-2", "us-east-2b", ""),
			wantPolicies: 1,
			wantMessage:  []string{"policy allow-on-prem-hosts/rule 0: rule matches jwt issuer https://idp.example.com, identity is aws"},
		},
		{
			name:     "jwt: empty subjects match any subject",
			policies: []authorizationv1alpha1.OnboardingPolicy{anySubject},
			group:    details, id: jwtID(idp, "anything", nil),
			wantAllowed: true, wantAllowedBy: RuleRef{"allow-any-subject", 0}, wantPolicies: 1,
		},
		{
			name:     "jwt: an AWS rule of the right kind is closer than a JWT rule",
			policies: []authorizationv1alpha1.OnboardingPolicy{onPrem, narrow},
			group:    ratings, id: ec2("123456789012", "us-east-2", "us-east-2a", "ratings-role"),
			wantPolicies: 2, wantClosest: []RuleRef{{narrowPolicy, 0}},
			wantNotInMessage: []string{"allow-on-prem-hosts"},
		},
		{
			name:     "matchExpressions Exists and DoesNotExist select",
			policies: []authorizationv1alpha1.OnboardingPolicy{exists},
			group:    group("bookinfo", "vms", "vm", "true"), id: ec2("123456789012", "us-east-2", "us-east-2b", ""),
			wantAllowed: true, wantAllowedBy: RuleRef{"allow-vm-groups", 0}, wantPolicies: 1,
		},
		{
			name:     "matchExpressions DoesNotExist excludes",
			policies: []authorizationv1alpha1.OnboardingPolicy{exists},
			group:    group("bookinfo", "vms", "vm", "true", "deprecated", "yes"), id: ec2("123456789012", "us-east-2", "us-east-2b", ""),
			wantPolicies: 1,
			wantMessage:  []string{"WorkloadGroup labels deprecated=yes,vm=true not selected by matchExpressions vm,!deprecated"},
		},
		{
			name:     "second onboardTo target selects",
			policies: []authorizationv1alpha1.OnboardingPolicy{twoTargets},
			group:    reviews, id: ec2("123456789012", "us-east-2", "us-east-2b", ""),
			wantAllowed: true, wantAllowedBy: RuleRef{"allow-two-groups", 0}, wantPolicies: 1,
		},
		{
			name:     "no onboardTo target selects",
			policies: []authorizationv1alpha1.OnboardingPolicy{twoTargets},
			group:    details, id: ec2("123456789012", "us-east-2", "us-east-2b", ""),
			wantPolicies: 1,
			wantMessage:  []string{"WorkloadGroup labels app=details not selected by matchLabels app=ratings or matchLabels app=reviews"},
		},
		{
			name:     "second workloads matcher is the closest",
			policies: []authorizationv1alpha1.OnboardingPolicy{twoMatchers},
			group:    ratings, id: ec2("123456789012", "us-east-2", "us-east-2a", ""),
			wantPolicies: 1, wantClosest: []RuleRef{{"multi", 0}},
			wantMessage: []string{"closest: policy multi/rule 0/workload 1: zone us-east-2a not in [us-east-2b]"},
		},
		{
			name:     "matcher with neither aws nor jwt never matches",
			policies: []authorizationv1alpha1.OnboardingPolicy{neither},
			group:    ratings, id: ec2("123456789012", "us-east-2", "us-east-2b", ""),
			wantPolicies: 1,
			wantMessage:  []string{"policy neither/rule 0: matcher sets none of aws, jwt, gcp, azure and ecs"},
		},
		{
			name:         "identity with neither aws nor jwt is denied",
			policies:     []authorizationv1alpha1.OnboardingPolicy{anyEC2},
			group:        ratings,
			wantPolicies: 1,
			wantMessage:  []string{"a workload without a verified identity is not authorized", "rule matches aws workloads, identity is empty"},
		},
		{
			name:     "invalid selector selects nothing and is reported",
			policies: []authorizationv1alpha1.OnboardingPolicy{broken},
			group:    ratings, id: ec2("123456789012", "us-east-2", "us-east-2b", ""),
			wantPolicies: 1, wantInvalidSelectors: 1,
			wantMessage: []string{"policy a-broken-selector/rule 0: WorkloadGroup labels app=ratings not selected by invalid onboardTo[0].workloadGroupSelector (", "Near"},
		},
		{
			name:     "invalid label value in matchLabels selects nothing",
			policies: []authorizationv1alpha1.OnboardingPolicy{badLabel},
			group:    group("bookinfo", "x", "app", "not a label value!"), id: ec2("123456789012", "us-east-2", "us-east-2b", ""),
			wantPolicies: 1, wantInvalidSelectors: 1,
			wantMessage: []string{"invalid onboardTo[0].workloadGroupSelector"},
		},
		{
			name:     "invalid selector evaluated before an allowing rule is still reported",
			policies: []authorizationv1alpha1.OnboardingPolicy{anyEC2, broken},
			group:    ratings, id: ec2("123456789012", "us-east-2", "us-east-2b", ""),
			wantAllowed: true, wantAllowedBy: RuleRef{anyPolicy, 0}, wantPolicies: 2, wantInvalidSelectors: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var before []authorizationv1alpha1.OnboardingPolicy
			for i := range tt.policies {
				before = append(before, *tt.policies[i].DeepCopy())
			}
			d := Evaluate(tt.policies, tt.group, tt.id)
			if !reflect.DeepEqual(before, tt.policies) {
				t.Error("Evaluate modified the policies")
			}
			if d.Allowed != tt.wantAllowed {
				t.Errorf("Allowed = %v, want %v; message: %s", d.Allowed, tt.wantAllowed, d.Message())
			}
			if tt.wantAllowed && d.AllowedBy != tt.wantAllowedBy {
				t.Errorf("AllowedBy = %v, want %v", d.AllowedBy, tt.wantAllowedBy)
			}
			if d.Policies != tt.wantPolicies {
				t.Errorf("Policies = %d, want %d", d.Policies, tt.wantPolicies)
			}
			if tt.wantAllowed && len(d.Closest) != 0 {
				t.Errorf("Closest = %v for an allowed decision", d.Closest)
			}
			if tt.wantClosest != nil {
				var got []RuleRef
				for _, f := range d.Closest {
					got = append(got, f.RuleRef)
				}
				if !reflect.DeepEqual(got, tt.wantClosest) {
					t.Errorf("Closest = %v, want %v", got, tt.wantClosest)
				}
			}
			if !tt.wantAllowed && tt.wantPolicies > 0 && len(d.Closest) == 0 {
				t.Error("a denial by existing policies names no closest rule")
			}
			if d.NeedsIAMRoleProof != tt.wantNeedsIAMRoleProof {
				t.Errorf("NeedsIAMRoleProof = %v, want %v", d.NeedsIAMRoleProof, tt.wantNeedsIAMRoleProof)
			}
			if len(d.InvalidSelectors) != tt.wantInvalidSelectors {
				t.Errorf("InvalidSelectors = %v, want %d", d.InvalidSelectors, tt.wantInvalidSelectors)
			}
			msg := d.Message()
			for _, want := range tt.wantMessage {
				if !strings.Contains(msg, want) {
					t.Errorf("message\n  %s\nlacks\n  %s", msg, want)
				}
			}
			for _, unwanted := range tt.wantNotInMessage {
				if strings.Contains(msg, unwanted) {
					t.Errorf("message\n  %s\ncontains %q", msg, unwanted)
				}
			}
			if len(msg) > MaxMessageLength {
				t.Errorf("message is %d bytes, more than %d", len(msg), MaxMessageLength)
			}
		})
	}
}

func TestEvaluateInvalidSelectorDetails(t *testing.T) {
	broken := policyYAML(t, brokenSelectorPolicy)
	d := Evaluate([]authorizationv1alpha1.OnboardingPolicy{broken}, group("bookinfo", "ratings", "app", "ratings"), ec2("123456789012", "us-east-2", "us-east-2b", ""))
	if len(d.InvalidSelectors) != 1 {
		t.Fatalf("InvalidSelectors = %v, want one", d.InvalidSelectors)
	}
	got := d.InvalidSelectors[0]
	if got.RuleRef != (RuleRef{"a-broken-selector", 0}) || got.Target != 0 || got.Err == nil {
		t.Errorf("InvalidSelector = %+v", got)
	}
	if want := "policy a-broken-selector/rule 0: onboardTo[0].workloadGroupSelector is invalid: "; !strings.HasPrefix(got.String(), want) {
		t.Errorf("String() = %q, want prefix %q", got.String(), want)
	}
}

// The decision, its message included, does not depend on the order of the
// policies.
func TestEvaluateIsDeterministic(t *testing.T) {
	anyEC2, narrow := seedPolicies(t)
	onPrem := policyYAML(t, onPremPolicy)
	twoMatchers := policyYAML(t, twoMatchersPolicy)
	orders := [][]authorizationv1alpha1.OnboardingPolicy{
		{anyEC2, narrow, onPrem, twoMatchers},
		{twoMatchers, onPrem, narrow, anyEC2},
		{narrow, twoMatchers, anyEC2, onPrem},
	}
	tests := []struct {
		name        string
		id          runtimev1alpha1.WorkloadIdentity
		wantAllowed bool
	}{
		{name: "denied", id: ec2("999999999999", "us-east-2", "us-east-2b", "")},
		{name: "allowed", id: ec2("123456789012", "us-east-2", "us-east-2b", "ratings-role"), wantAllowed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var want string
			for i, policies := range orders {
				d := Evaluate(policies, group("bookinfo", "ratings", "app", "ratings"), tt.id)
				if d.Allowed != tt.wantAllowed {
					t.Fatalf("order %d: Allowed = %v: %s", i, d.Allowed, d.Message())
				}
				if i == 0 {
					want = d.Message()
					continue
				}
				if got := d.Message(); got != want {
					t.Errorf("order %d: message\n  %s\nwant\n  %s", i, got, want)
				}
			}
		})
	}
}

// Denial messages stay bounded whatever the policies and identity hold.
func TestEvaluateBoundsMessages(t *testing.T) {
	many := make([]authorizationv1alpha1.OnboardingPolicy, 10)
	for i := range many {
		many[i] = policyYAML(t, fmt.Sprintf(`
metadata: {name: p%02d, namespace: bookinfo}
spec:
  allow:
  - workloads: [{aws: {accounts: ['%012d']}}]
    onboardTo: [{workloadGroupSelector: {}}]
`, i, i))
	}
	var accounts []string
	for i := range 200 {
		accounts = append(accounts, fmt.Sprintf("'%012d'", 100000000000+i))
	}
	bigList := policyYAML(t, `
metadata: {name: big, namespace: bookinfo}
spec:
  allow:
  - workloads: [{aws: {accounts: [`+strings.Join(accounts, ",")+`]}}]
    onboardTo: [{workloadGroupSelector: {}}]
`)
	long := strings.Repeat("ü", 3000)
	hugeJWT := policyYAML(t, `
metadata: {name: huge, namespace: bookinfo}
spec:
  allow:
  - workloads: [{jwt: {issuer: "https://`+strings.Repeat("x", 2000)+`", subjects: ["`+strings.Repeat("s", 1000)+`"]}}]
    onboardTo: [{workloadGroupSelector: {matchLabels: {app: ratings}}}]
`)

	tests := []struct {
		name            string
		policies        []authorizationv1alpha1.OnboardingPolicy
		id              runtimev1alpha1.WorkloadIdentity
		wantClosest     int
		wantMoreClosest int
		wantMessage     []string
	}{
		{
			name: "ten equally close rules", policies: many,
			id:          ec2("999999999999", "us-east-2", "us-east-2b", ""),
			wantClosest: MaxClosestRules, wantMoreClosest: 10 - MaxClosestRules,
			wantMessage: []string{"policy p00/rule 0", "policy p02/rule 0", "; and 7 more rules as close"},
		},
		{
			name: "long account list", policies: []authorizationv1alpha1.OnboardingPolicy{bigList},
			id:          ec2("999999999999", "us-east-2", "us-east-2b", ""),
			wantClosest: 1,
			wantMessage: []string{"account 999999999999 not in [100000000000 100000000001", "100000000007 (+192 more)]"},
		},
		{
			name: "huge identity and policy values", policies: []authorizationv1alpha1.OnboardingPolicy{hugeJWT},
			id:          jwtID("https://"+long, long, nil),
			wantClosest: 1,
			wantMessage: []string{"jwt issuer https://üüü", "…"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Evaluate(tt.policies, group("bookinfo", "details", "app", "details"), tt.id)
			if d.Allowed {
				t.Fatal("allowed")
			}
			if len(d.Closest) != tt.wantClosest || d.MoreClosest != tt.wantMoreClosest {
				t.Errorf("Closest = %d, MoreClosest = %d; want %d, %d", len(d.Closest), d.MoreClosest, tt.wantClosest, tt.wantMoreClosest)
			}
			msg := d.Message()
			if len(msg) > MaxMessageLength || !utf8.ValidString(msg) {
				t.Errorf("message of %d bytes (valid UTF-8: %v), want at most %d", len(msg), utf8.ValidString(msg), MaxMessageLength)
			}
			for _, want := range tt.wantMessage {
				if !strings.Contains(msg, want) {
					t.Errorf("message\n  %s\nlacks\n  %s", msg, want)
				}
			}
		})
	}
}

func TestRequiresIAMRoleProof(t *testing.T) {
	anyEC2, narrow := seedPolicies(t)
	broken := policyYAML(t, brokenSelectorPolicy)
	brokenWithRole := *broken.DeepCopy()
	brokenWithRole.Spec.Allow[0].Workloads[0].AWS.EC2 = &authorizationv1alpha1.EC2Matcher{IAMRoleNames: []string{"r"}}
	ratings := GroupRefOf(seedGroup(t))

	tests := []struct {
		name     string
		policies []authorizationv1alpha1.OnboardingPolicy
		group    GroupRef
		want     bool
	}{
		{name: "narrow policy selects ratings", policies: []authorizationv1alpha1.OnboardingPolicy{anyEC2, narrow}, group: ratings, want: true},
		{name: "narrow policy does not select details", policies: []authorizationv1alpha1.OnboardingPolicy{anyEC2, narrow}, group: group("bookinfo", "details", "app", "details")},
		{name: "any-ec2 names no role", policies: []authorizationv1alpha1.OnboardingPolicy{anyEC2}, group: ratings},
		{name: "policy of another namespace", policies: []authorizationv1alpha1.OnboardingPolicy{inNamespace(narrow, "reviews")}, group: ratings},
		{name: "no policies", group: ratings},
		{name: "invalid selector selects nothing", policies: []authorizationv1alpha1.OnboardingPolicy{brokenWithRole}, group: ratings},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RequiresIAMRoleProof(tt.policies, tt.group); got != tt.want {
				t.Errorf("RequiresIAMRoleProof = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDescribeIdentity(t *testing.T) {
	tests := []struct {
		name string
		id   runtimev1alpha1.WorkloadIdentity
		want string
	}{
		{
			name: "ec2 with proven role", id: ec2("123456789012", "us-east-2", "us-east-2b", "ratings-role"),
			want: "aws partition aws account 123456789012 region us-east-2 zone us-east-2b instance i-1234567890abcdef0 iam role ratings-role",
		},
		{
			name: "ec2 without role", id: ec2("123456789012", "us-east-2", "us-east-2b", ""),
			want: "aws partition aws account 123456789012 region us-east-2 zone us-east-2b instance i-1234567890abcdef0",
		},
		{
			name: "aws without ec2",
			id:   runtimev1alpha1.WorkloadIdentity{AWS: &runtimev1alpha1.AWSIdentity{Partition: "aws-cn", Account: "123456789012", Region: "cn-north-1", Zone: "cn-north-1a"}},
			want: "aws partition aws-cn account 123456789012 region cn-north-1 zone cn-north-1a",
		},
		{name: "jwt", id: jwtID("https://idp.example.com", "host-1", map[string]string{"env": "prod"}), want: "jwt issuer https://idp.example.com subject host-1"},
		{name: "empty", want: "a workload without a verified identity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DescribeIdentity(tt.id); got != tt.want {
				t.Errorf("DescribeIdentity = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestTruncateAndClip(t *testing.T) {
	tests := []struct {
		name string
		got  string
		want string
	}{
		{name: "short value kept", got: clip("us-east-2b"), want: "us-east-2b"},
		{name: "value at the limit kept", got: clip(strings.Repeat("a", maxValueRunes)), want: strings.Repeat("a", maxValueRunes)},
		{name: "long value clipped by runes", got: clip(strings.Repeat("é", maxValueRunes+1)), want: strings.Repeat("é", maxValueRunes-1) + "…"},
		{name: "short message kept", got: truncate("abc", 10), want: "abc"},
		{name: "message at the limit kept", got: truncate("aaaaaaé", 8), want: "aaaaaaé"},
		{name: "message cut on a rune boundary", got: truncate("aaaaébbbb", 8), want: "aaaa…"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
}

func TestDeniedError(t *testing.T) {
	d := Evaluate(nil, group("bookinfo", "ratings"), ec2("123456789012", "us-east-2", "us-east-2b", ""))
	err := fmt.Errorf("onboard: %w", &DeniedError{Decision: d})
	tests := []struct {
		name string
		got  bool
		want bool
	}{
		{name: "is ErrDenied", got: errors.Is(err, ErrDenied), want: true},
		{name: "is not ErrWorkloadGroupNotFound", got: errors.Is(err, ErrWorkloadGroupNotFound), want: false},
		{name: "message is the decision's", got: strings.HasSuffix(err.Error(), d.Message()), want: true},
		{name: "As finds the decision", got: func() bool {
			var de *DeniedError
			return errors.As(err, &de) && de.Decision.Group.Name == "ratings"
		}(), want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
}
