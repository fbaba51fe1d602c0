package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// gen draws policies and identities from small pools of values, so that
// generated identities often match, nearly match or match only some rules.
type gen struct{ r *rand.Rand }

func (g gen) pick(pool ...string) string { return pool[g.r.IntN(len(pool))] }

// list returns nil (unset), an empty list (matches nothing) or one to three
// values of pool.
func (g gen) list(pool ...string) []string {
	switch g.r.IntN(6) {
	case 0, 1:
		return nil
	case 2:
		if g.r.IntN(3) == 0 {
			return []string{}
		}
	}
	n := 1 + g.r.IntN(3)
	out := make([]string, n)
	for i := range out {
		out[i] = g.pick(pool...)
	}
	return out
}

// required is a list of a required field: never unset, sometimes empty.
func (g gen) required(pool ...string) []string {
	if l := g.list(pool...); l != nil {
		return l
	}
	return []string{g.pick(pool...)}
}

var (
	poolAccounts = []string{"111111111111", "222222222222", "333333333333", ""}
	poolRegions  = []string{"us-east-1", "us-east-2"}
	poolZones    = []string{"us-east-2a", "us-east-2b", "us-central1-a"}
	poolRoles    = []string{"ratings-role", "details-role"}
	poolIssuers  = []string{"https://a", "https://b"}
	poolSubjects = []string{"host-1", "host-2"}
	poolProjects = []string{"proj-a", "proj-b"}
	// Tenants compared without case, with non-ASCII forms that fold to
	// ASCII ones (U+212A KELVIN SIGN folds to k, U+017F LONG S to s).
	poolTenants = []string{"tenant-k", "TENANT-K", "tenant-\u212a", "\u017fub-s", "sub-s"}
	poolSubs    = []string{"sub-1", "SUB-1", "sub-2"}
	poolRGs     = []string{"rg-1", "rg-2"}
	poolLocs    = []string{"westeurope", "eastus"}
	poolApps    = []string{"ratings", "details"}
)

func (g gen) matcher() authorizationv1alpha1.WorkloadMatcher {
	var m authorizationv1alpha1.WorkloadMatcher
	switch g.r.IntN(7) {
	case 0:
		m.AWS = &authorizationv1alpha1.AWSMatcher{Accounts: g.required(poolAccounts...), Regions: g.list(poolRegions...), Zones: g.list(poolZones...)}
		if g.r.IntN(4) == 0 {
			m.AWS.Partitions = []authorizationv1alpha1.AWSPartition{authorizationv1alpha1.AWSPartition(g.pick("aws", "aws-cn"))}
		}
		if g.r.IntN(2) == 0 {
			m.AWS.EC2 = &authorizationv1alpha1.EC2Matcher{IAMRoleNames: g.list(poolRoles...), RequireSTSProof: g.r.IntN(4) == 0}
		}
	case 1:
		m.JWT = &authorizationv1alpha1.JWTMatcher{Issuer: g.pick(poolIssuers...), Subjects: g.list(poolSubjects...)}
		if g.r.IntN(3) == 0 {
			m.JWT.Attributes = []authorizationv1alpha1.JWTAttributeMatcher{{Name: "team", Values: g.required("ratings", "details")}}
		}
	case 2:
		m.GCP = &authorizationv1alpha1.GCPMatcher{Projects: g.required(poolProjects...), Zones: g.list(poolZones...), InstanceNamePatterns: g.list("ratings-*", "[", "details-1")}
	case 3:
		m.Azure = &authorizationv1alpha1.AzureMatcher{Tenants: g.required(poolTenants...), Subscriptions: g.required(poolSubs...), ResourceGroups: g.list(poolRGs...), Locations: g.list(poolLocs...)}
	case 4:
		m.ECS = &authorizationv1alpha1.ECSMatcher{Accounts: g.required(poolAccounts...), Regions: g.list(poolRegions...), Clusters: g.list("prod", "dev"), TaskRoles: g.list(poolRoles...)}
	case 5:
		// Malformed: two kinds.
		m.AWS = &authorizationv1alpha1.AWSMatcher{Accounts: g.required(poolAccounts...)}
		m.JWT = &authorizationv1alpha1.JWTMatcher{Issuer: g.pick(poolIssuers...)}
	default:
		// Malformed when the draw is 6 and nothing else is set: no kind.
		if g.r.IntN(2) == 0 {
			m.AWS = &authorizationv1alpha1.AWSMatcher{Accounts: g.required(poolAccounts...)}
		}
	}
	return m
}

func (g gen) selector() authorizationv1alpha1.OnboardTarget {
	var t authorizationv1alpha1.OnboardTarget
	switch g.r.IntN(5) {
	case 0:
	case 1:
		t.WorkloadGroupSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus", Values: []string{"x"}}}
	case 2:
		t.WorkloadGroupSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: g.required(poolApps...)}}
	default:
		t.WorkloadGroupSelector.MatchLabels = map[string]string{"app": g.pick(poolApps...)}
	}
	return t
}

func (g gen) policies() []authorizationv1alpha1.OnboardingPolicy {
	out := make([]authorizationv1alpha1.OnboardingPolicy, g.r.IntN(9))
	for i := range out {
		p := &out[i]
		p.Name = fmt.Sprintf("p-%d", g.r.IntN(20))
		p.Namespace = g.pick("bookinfo", "bookinfo", "bookinfo", "other")
		p.Spec.Allow = make([]authorizationv1alpha1.AllowRule, g.r.IntN(4))
		for ri := range p.Spec.Allow {
			rule := &p.Spec.Allow[ri]
			rule.Workloads = make([]authorizationv1alpha1.WorkloadMatcher, g.r.IntN(3))
			for wi := range rule.Workloads {
				rule.Workloads[wi] = g.matcher()
			}
			rule.OnboardTo = make([]authorizationv1alpha1.OnboardTarget, g.r.IntN(3))
			for ti := range rule.OnboardTo {
				rule.OnboardTo[ti] = g.selector()
			}
			if g.r.IntN(2) == 0 {
				rule.AddressCIDRs = []authorizationv1alpha1.CIDR{authorizationv1alpha1.CIDR(g.pick("192.0.2.0/24", "198.51.100.0/24", "bad"))}
			}
		}
	}
	return out
}

func (g gen) identity() runtimev1alpha1.WorkloadIdentity {
	var id runtimev1alpha1.WorkloadIdentity
	kinds := 1
	if g.r.IntN(20) == 0 {
		kinds = g.r.IntN(3) // none, one or two parts
	}
	for range kinds {
		switch g.r.IntN(5) {
		case 0:
			id.AWS = &runtimev1alpha1.AWSIdentity{Partition: g.pick("aws", "aws-cn"), Account: g.pick(poolAccounts...), Region: g.pick(poolRegions...), Zone: g.pick(poolZones...)}
			if g.r.IntN(4) != 0 {
				id.AWS.EC2 = &runtimev1alpha1.EC2Identity{InstanceID: "i-1", IAMRole: g.pick("", "", "ratings-role", "details-role")}
			}
		case 1:
			id.JWT = &runtimev1alpha1.JWTIdentity{Issuer: g.pick(poolIssuers...), Subject: g.pick(poolSubjects...)}
			if g.r.IntN(2) == 0 {
				id.JWT.Attributes = map[string]string{"team": g.pick("ratings", "details")}
			}
		case 2:
			id.GCP = &runtimev1alpha1.GCPIdentity{ProjectID: g.pick(poolProjects...), Zone: g.pick(poolZones...), InstanceName: g.pick("ratings-1", "details-1")}
		case 3:
			id.Azure = &runtimev1alpha1.AzureIdentity{TenantID: g.pick(poolTenants...), SubscriptionID: g.pick(poolSubs...), ResourceGroup: g.pick(poolRGs...), Location: g.pick(poolLocs...), VMConfirmed: g.r.IntN(2) == 0}
		default:
			id.ECS = &runtimev1alpha1.ECSIdentity{Account: g.pick(poolAccounts...), Region: g.pick(poolRegions...), Cluster: g.pick("prod", "dev"), TaskRole: g.pick(poolRoles...), TaskConfirmed: g.r.IntN(2) == 0}
		}
	}
	return id
}

// TestIndexDecidesAsEvaluate compares, over generated tables of policies
// and identities, every answer of an Index with the full scan's: the
// Decision of Evaluate (allowed or denied, the rule, the closest rules,
// their reasons and invalid selectors), RequiresIAMRoleProof and
// AddressAllowed; and Precheck's, which leaves out only the closest rules
// of a denial a proof or a confirmation could lift.
func TestIndexDecidesAsEvaluate(t *testing.T) {
	g := gen{r: rand.New(rand.NewPCG(1, 2))}
	addrs := []netip.Addr{netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("203.0.113.1")}
	var allowed, denied, flagged int
	for range 3000 {
		policies := g.policies()
		ix := NewIndex(policies, "bookinfo")
		group := GroupRef{Namespace: g.pick("bookinfo", "bookinfo", "other"), Name: "ratings", Labels: map[string]string{"app": g.pick(poolApps...)}}
		for range 8 {
			id := g.identity()
			want := Evaluate(policies, group, id)
			got := ix.Evaluate(group, id)
			if group.Namespace != "bookinfo" {
				// An Index holds one namespace: it knows no policy of another.
				want = Evaluate(nil, group, id)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("identity %s\nindex: %+v\nscan:  %+v", DescribeIdentity(id), got, want)
			}
			if want.Allowed {
				allowed++
			} else {
				denied++
			}
			pre := ix.Precheck(group, id)
			if pre.NeedsIAMRoleProof || pre.NeedsConfirmation {
				flagged++
				if pre.Allowed || pre.NeedsIAMRoleProof != want.NeedsIAMRoleProof || pre.NeedsConfirmation != want.NeedsConfirmation || pre.Policies != want.Policies {
					t.Fatalf("Precheck %+v, Evaluate %+v", pre, want)
				}
			} else if !reflect.DeepEqual(pre, want) {
				t.Fatalf("Precheck %+v, Evaluate %+v", pre, want)
			}
			if group.Namespace != "bookinfo" {
				continue
			}
			if got, want := ix.RequiresIAMRoleProof(group), RequiresIAMRoleProof(policies, group); got != want {
				t.Fatalf("RequiresIAMRoleProof = %v, scan %v, policies %+v", got, want, policies)
			}
			for _, a := range addrs {
				if got, want := ix.AddressAllowed(group, id, a), AddressAllowed(policies, group, id, a); got != want {
					t.Fatalf("AddressAllowed(%s) = %v, scan %v, policies %+v, identity %s", a, got, want, policies, DescribeIdentity(id))
				}
			}
		}
	}
	// The table must exercise both outcomes and the flags, or it proves
	// little.
	if allowed < 500 || denied < 500 || flagged < 50 {
		t.Fatalf("generated %d allowed, %d denied, %d flagged decisions; the generator no longer covers both outcomes", allowed, denied, flagged)
	}
	t.Logf("%d allowed, %d denied, %d flagged by Precheck", allowed, denied, flagged)
}

// TestIndexEvaluatesOnlyCandidates checks that the rules an Index evaluates
// for a request are those listed under the identity's key: a thousand
// policies of other accounts add none.
func TestIndexEvaluatesOnlyCandidates(t *testing.T) {
	policies := benchPolicies(1000)
	ix := NewIndex(policies, "bookinfo")
	id := ec2(fmt.Sprintf("%012d", 100000000000+999), "us-east-2", "us-east-2b", "ratings-role")
	if got := ix.candidates(id); len(got) != 1 {
		t.Fatalf("candidates = %d rules, want 1", len(got))
	}
	group := GroupRef{Namespace: "bookinfo", Name: "ratings", Labels: map[string]string{"app": "ratings"}}
	if d := ix.Evaluate(group, id); !d.Allowed || d.AllowedBy.Policy != "policy-0999" {
		t.Fatalf("decision %+v, want allowed by policy-0999", d)
	}
	if got := ix.candidates(ec2("999999999999", "us-east-2", "us-east-2b", "")); len(got) != 0 {
		t.Fatalf("candidates of an unknown account = %d rules, want 0", len(got))
	}
}
