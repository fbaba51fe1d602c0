package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	networkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// MaxClosestRules is how many of the closest failing rules a Decision keeps
// (and its message lists); further rules that are equally close are only
// counted, in Decision.MoreClosest.
const MaxClosestRules = 3

var (
	_ fmt.Stringer = GroupRef{}
	_ fmt.Stringer = RuleRef{}
	_ fmt.Stringer = RuleFailure{}
	_ fmt.Stringer = InvalidSelector{}
)

// GroupRef is the WorkloadGroup a workload asks to join.
type GroupRef struct {
	// Namespace and Name of the WorkloadGroup.
	Namespace string
	Name      string
	// Labels are the WorkloadGroup's metadata labels (not its template's):
	// onboardTo[].workloadGroupSelector selects on them.
	Labels map[string]string
}

// GroupRefOf returns the GroupRef of a WorkloadGroup. The labels map is
// shared, not copied.
func GroupRefOf(wg *networkingv1.WorkloadGroup) GroupRef {
	return GroupRef{Namespace: wg.Namespace, Name: wg.Name, Labels: wg.Labels}
}

// String returns namespace/name.
func (g GroupRef) String() string { return g.Namespace + "/" + g.Name }

// RuleRef names one rule: spec.allow[Rule] of the OnboardingPolicy Policy (in
// the WorkloadGroup's namespace).
type RuleRef struct {
	Policy string
	Rule   int
}

// String returns "policy <name>/rule <index>".
func (r RuleRef) String() string { return fmt.Sprintf("policy %s/rule %d", r.Policy, r.Rule) }

// RuleFailure says why one rule did not allow the workload.
type RuleFailure struct {
	RuleRef
	// Workload is the index of the rule's closest workloads[] matcher, the
	// one Reasons describe.
	Workload int
	// Reasons are the constraints that failed, each written for an operator,
	// e.g. "zone us-east-2a not in [us-east-2b]" or
	// "WorkloadGroup labels app=details not selected by matchLabels app=ratings".
	Reasons []string
	// multipleWorkloads is set when the rule has more than one matcher, so
	// that String names the one Reasons describe.
	multipleWorkloads bool
}

// String returns "policy <name>/rule <i>: <reason>, <reason>" (with
// "/workload <j>" after the rule when the rule has several matchers).
func (f RuleFailure) String() string {
	var b strings.Builder
	b.WriteString(f.RuleRef.String())
	if f.multipleWorkloads {
		fmt.Fprintf(&b, "/workload %d", f.Workload)
	}
	b.WriteString(": ")
	b.WriteString(strings.Join(f.Reasons, ", "))
	return b.String()
}

// InvalidSelector is an onboardTo[].workloadGroupSelector that
// metav1.LabelSelectorAsSelector refuses. Such a target selects nothing.
type InvalidSelector struct {
	RuleRef
	// Target is the index in the rule's onboardTo.
	Target int
	// Err is the parse error.
	Err error
}

// String names the selector and the error.
func (s InvalidSelector) String() string {
	return fmt.Sprintf("%s: onboardTo[%d].workloadGroupSelector is invalid: %v", s.RuleRef, s.Target, s.Err)
}

// Decision is the outcome of Evaluate.
type Decision struct {
	// Allowed is true when a rule allowed the workload.
	Allowed bool
	// AllowedBy is the rule that allowed it (when Allowed): the first one in
	// the order policy name, rule index.
	AllowedBy RuleRef
	// Group is the WorkloadGroup asked for.
	Group GroupRef
	// Identity is the workload's verified identity (not copied).
	Identity runtimev1alpha1.WorkloadIdentity
	// Policies is the number of OnboardingPolicies in the group's namespace;
	// 0 means the namespace has none.
	Policies int
	// Closest are the failing rules closest to allowing the workload (fewest
	// failed constraints; a matcher for the other kind of identity is
	// furthest), at most MaxClosestRules, in the order policy name, rule
	// index. Empty when Allowed.
	Closest []RuleFailure
	// MoreClosest counts rules exactly as close as Closest that were left
	// out.
	MoreClosest int
	// InvalidSelectors are the invalid workloadGroupSelectors met while
	// evaluating (the endpoint should log them: they select nothing). When
	// the workload is allowed, only rules up to the allowing one were
	// evaluated.
	InvalidSelectors []InvalidSelector
	// NeedsIAMRoleProof is true when the workload was denied, is an EC2
	// instance without a proven IAM role, and some rule selecting the group
	// fails only because it requires a proven role from its iamRoleNames.
	// Asking the agent for a signed sts:GetCallerIdentity request (and
	// evaluating again) may then allow it.
	NeedsIAMRoleProof bool
	// NeedsConfirmation is true when the workload was denied, is not
	// confirmed by its platform's API, and some rule selecting the group
	// fails only because it requires that confirmation (an azure rule
	// naming locations). Confirming it with Azure Resource Manager (and
	// evaluating again) may then allow it.
	NeedsConfirmation bool
}

// Evaluate decides whether the workload with identity id may join group,
// given OnboardingPolicies. Policies of namespaces other than the group's are
// ignored. Onboarding is denied unless a rule of a policy in the group's
// namespace matches id with one of its workloads matchers and selects the
// group's labels with one of its onboardTo selectors.
//
// Evaluation is deterministic: policies are considered in name order, rules
// in index order, whatever the order of the slice. Evaluate does not modify
// policies.
//
// Evaluate evaluates every rule; an Index decides the same for a fraction
// of the cost when a namespace holds many policies.
func Evaluate(policies []authorizationv1alpha1.OnboardingPolicy, group GroupRef, id runtimev1alpha1.WorkloadIdentity) Decision {
	return evaluateSorted(policiesIn(policies, group.Namespace), group, id)
}

// evaluateSorted is Evaluate over applicable, the policies of the group's
// namespace sorted by name.
func evaluateSorted(applicable []*authorizationv1alpha1.OnboardingPolicy, group GroupRef, id runtimev1alpha1.WorkloadIdentity) Decision {
	d := Decision{Group: group, Identity: id}
	d.Policies = len(applicable)
	if len(applicable) == 0 {
		return d
	}
	groupLabels := labels.Set(group.Labels)

	type candidate struct {
		policy   *authorizationv1alpha1.OnboardingPolicy
		rule     int
		workload int
	}
	var (
		closest     [MaxClosestRules]candidate
		nClosest    int
		best        = -1
		roleOnlyHit bool
		confirmHit  bool
	)
	for _, p := range applicable {
		for ri := range p.Spec.Allow {
			rule := &p.Spec.Allow[ri]
			wi, dist, roleOnly, confirmOnly := closestWorkload(rule.Workloads, id)
			selected := selectsGroup(rule.OnboardTo, groupLabels, func(target int, err error) {
				d.InvalidSelectors = append(d.InvalidSelectors, InvalidSelector{
					RuleRef: RuleRef{Policy: p.Name, Rule: ri}, Target: target, Err: err,
				})
			})
			if dist == 0 && selected {
				d.Allowed = true
				d.AllowedBy = RuleRef{Policy: p.Name, Rule: ri}
				// Closest and MoreClosest describe denials only.
				d.MoreClosest = 0
				return d
			}
			if selected && roleOnly {
				roleOnlyHit = true
			}
			if selected && confirmOnly {
				confirmHit = true
			}
			if !selected {
				dist++
			}
			switch {
			case best < 0 || dist < best:
				best, nClosest, d.MoreClosest = dist, 0, 0
				fallthrough
			case dist == best:
				if nClosest < len(closest) {
					closest[nClosest] = candidate{policy: p, rule: ri, workload: wi}
					nClosest++
				} else {
					d.MoreClosest++
				}
			}
		}
	}
	d.NeedsIAMRoleProof = roleOnlyHit
	d.NeedsConfirmation = confirmHit
	d.Closest = make([]RuleFailure, nClosest)
	for i, c := range closest[:nClosest] {
		rule := &c.policy.Spec.Allow[c.rule]
		f := RuleFailure{
			RuleRef:           RuleRef{Policy: c.policy.Name, Rule: c.rule},
			Workload:          c.workload,
			multipleWorkloads: len(rule.Workloads) > 1,
		}
		if c.workload < len(rule.Workloads) {
			f.Reasons = workloadReasons(&rule.Workloads[c.workload], id)
		} else {
			f.Reasons = []string{"rule lists no workloads"}
		}
		if !selectsGroup(rule.OnboardTo, groupLabels, nil) {
			f.Reasons = append(f.Reasons, groupReason(rule.OnboardTo, group))
		}
		d.Closest[i] = f
	}
	return d
}

// RequiresIAMRoleProof reports whether some rule of a policy in the group's
// namespace that selects the group has an AWS matcher naming iamRoleNames:
// only then can a proven IAM role change a decision for this group, so only
// then is it worth asking the agent for a signed sts:GetCallerIdentity
// request. It does not look at the identity; Decision.NeedsIAMRoleProof
// says whether a proof would help a particular denied identity.
func RequiresIAMRoleProof(policies []authorizationv1alpha1.OnboardingPolicy, group GroupRef) bool {
	groupLabels := labels.Set(group.Labels)
	for i := range policies {
		p := &policies[i]
		if p.Namespace != group.Namespace {
			continue
		}
		for ri := range p.Spec.Allow {
			rule := &p.Spec.Allow[ri]
			if !namesIAMRoles(rule.Workloads) {
				continue
			}
			if selectsGroup(rule.OnboardTo, groupLabels, nil) {
				return true
			}
		}
	}
	return false
}

func namesIAMRoles(ws []authorizationv1alpha1.WorkloadMatcher) bool {
	for i := range ws {
		if a := ws[i].AWS; a != nil && a.EC2 != nil && (len(a.EC2.IAMRoleNames) > 0 || a.EC2.RequireSTSProof) {
			return true
		}
	}
	return false
}

// AddressAllowed reports whether some rule of a policy in the group's
// namespace that allows id to join group lists, in its addressCIDRs, a
// prefix holding addr. Rules without addressCIDRs allow no unproven address.
// A malformed CIDR (admission refuses them) holds nothing.
func AddressAllowed(policies []authorizationv1alpha1.OnboardingPolicy, group GroupRef, id runtimev1alpha1.WorkloadIdentity, addr netip.Addr) bool {
	groupLabels := labels.Set(group.Labels)
	for _, p := range policiesIn(policies, group.Namespace) {
		for ri := range p.Spec.Allow {
			rule := &p.Spec.Allow[ri]
			if !cidrsHold(rule.AddressCIDRs, addr) {
				continue
			}
			if _, dist, _, _ := closestWorkload(rule.Workloads, id); dist == 0 && selectsGroup(rule.OnboardTo, groupLabels, nil) {
				return true
			}
		}
	}
	return false
}

func cidrsHold(cidrs []authorizationv1alpha1.CIDR, addr netip.Addr) bool {
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(string(c)); err == nil && p.Contains(addr) {
			return true
		}
	}
	return false
}

// policiesIn returns pointers to the policies of namespace ns, sorted by
// name.
func policiesIn(policies []authorizationv1alpha1.OnboardingPolicy, ns string) []*authorizationv1alpha1.OnboardingPolicy {
	n := 0
	for i := range policies {
		if policies[i].Namespace == ns {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]*authorizationv1alpha1.OnboardingPolicy, 0, n)
	for i := range policies {
		if policies[i].Namespace == ns {
			out = append(out, &policies[i])
		}
	}
	slices.SortStableFunc(out, func(a, b *authorizationv1alpha1.OnboardingPolicy) int {
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// selectsGroup reports whether any target selects the labels. A target whose
// selector does not parse selects nothing and is reported to invalid (when
// not nil).
func selectsGroup(targets []authorizationv1alpha1.OnboardTarget, set labels.Set, invalid func(target int, err error)) bool {
	for i := range targets {
		sel, err := selectorOf(&targets[i].WorkloadGroupSelector)
		if err != nil {
			if invalid != nil {
				invalid(i, err)
			}
			continue
		}
		if sel.Matches(set) {
			return true
		}
	}
	return false
}

// selectorOf converts a label selector; `{}` selects everything.
func selectorOf(s *metav1.LabelSelector) (labels.Selector, error) {
	if len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0 {
		return labels.Everything(), nil
	}
	return metav1.LabelSelectorAsSelector(s)
}

// Selects reports whether an onboardTo selector of a rule of p selects the
// WorkloadGroup (of p's namespace): the groups p can let workloads join.
func Selects(p *authorizationv1alpha1.OnboardingPolicy, group GroupRef) bool {
	if p.Namespace != group.Namespace {
		return false
	}
	for i := range p.Spec.Allow {
		if selectsGroup(p.Spec.Allow[i].OnboardTo, labels.Set(group.Labels), nil) {
			return true
		}
	}
	return false
}
