package policy

import (
	"net/netip"
	"slices"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/labels"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// identityKind names, for the index, the part of a WorkloadIdentity a
// matcher is for.
type kind uint8

const (
	kindAWS kind = iota
	kindJWT
	kindGCP
	kindAzure
	kindECS
	numKinds
)

// indexKey is one exact-match key: the value of the required field a
// matcher of its kind lists (aws and ecs accounts, gcp projects, azure
// tenants, the jwt issuer).
type indexKey struct {
	kind  kind
	value string
}

// target is one onboardTo selector, parsed once.
type target struct {
	sel labels.Selector
	err error
}

// indexedRule is one rule, at its place in the order policy name, rule
// index.
type indexedRule struct {
	policy  *authorizationv1alpha1.OnboardingPolicy
	index   int
	rule    *authorizationv1alpha1.AllowRule
	targets []target
}

// Index holds the OnboardingPolicies of one namespace, ready to decide
// requests for the WorkloadGroups of that namespace without looking at the
// rules that cannot match a request's identity. Every well-formed matcher
// requires its identity to carry one of a listed set of exact values (an
// aws or ecs account, a gcp project, an azure tenant, a jwt issuer), so a
// rule can allow only identities holding one of its matchers' keys: the
// Index lists each rule under those keys, and a request evaluates only the
// rules listed under its identity's key. Its decisions are those of
// Evaluate over the same policies; a denial, whose message names the rules
// closest to allowing among all of the namespace's, is computed by
// evaluating every rule.
//
// An Index is immutable, and safe for concurrent use; it shares (does not
// copy) the policies it was built from, which must not be modified.
type Index struct {
	namespace string
	sorted    []*authorizationv1alpha1.OnboardingPolicy
	rules     []indexedRule
	byKey     map[indexKey][]int
	// foldAll lists, per kind, the rules that must be evaluated for every
	// identity of that kind whose key the map cannot look up exactly (an
	// azure tenant that is not ASCII, compared without case).
	foldAll [numKinds][]int
	// unkeyed lists, per kind, the rules holding a matcher of that kind
	// whose key the map cannot hold exactly (an azure tenant that is not
	// ASCII); they are evaluated for every identity of that kind.
	unkeyed [numKinds][]int
	// invalid lists the rules with a selector that does not parse.
	invalid []int
	// roleRules lists the rules with an aws matcher naming IAM roles or
	// requiring an STS proof.
	roleRules []int
}

// NewIndex returns the Index of the policies of namespace ns (policies of
// other namespaces are ignored).
func NewIndex(policies []authorizationv1alpha1.OnboardingPolicy, ns string) *Index {
	ix := &Index{namespace: ns, sorted: policiesIn(policies, ns), byKey: map[indexKey][]int{}}
	for _, p := range ix.sorted {
		for ri := range p.Spec.Allow {
			ix.add(p, ri)
		}
	}
	return ix
}

// add appends rule ri of p and lists it under its matchers' keys.
func (ix *Index) add(p *authorizationv1alpha1.OnboardingPolicy, ri int) {
	pos := len(ix.rules)
	rule := &p.Spec.Allow[ri]
	r := indexedRule{policy: p, index: ri, rule: rule, targets: make([]target, len(rule.OnboardTo))}
	bad := false
	for i := range rule.OnboardTo {
		r.targets[i].sel, r.targets[i].err = selectorOf(&rule.OnboardTo[i].WorkloadGroupSelector)
		bad = bad || r.targets[i].err != nil
	}
	ix.rules = append(ix.rules, r)
	if bad {
		ix.invalid = append(ix.invalid, pos)
	}
	if namesIAMRoles(rule.Workloads) {
		ix.roleRules = append(ix.roleRules, pos)
	}
	for wi := range rule.Workloads {
		m := &rule.Workloads[wi]
		if matcherKinds(m) != 1 {
			continue // never matches
		}
		k, values := matcherKeys(m)
		for _, v := range values {
			if k == kindAzure {
				lv, ok := foldASCII(v)
				if !ok {
					ix.unkeyed[k] = appendPos(ix.unkeyed[k], pos)
					continue
				}
				v = lv
			}
			ix.byKey[indexKey{k, v}] = appendPos(ix.byKey[indexKey{k, v}], pos)
		}
		if k == kindAzure {
			ix.foldAll[k] = appendPos(ix.foldAll[k], pos)
		}
	}
}

// appendPos appends pos unless it is already the last element (a rule
// listed twice under one key by two of its matchers).
func appendPos(l []int, pos int) []int {
	if len(l) > 0 && l[len(l)-1] == pos {
		return l
	}
	return append(l, pos)
}

// matcherKeys returns the kind of a well-formed matcher and the values of
// its required exact-match field: an identity it matches holds one of them.
func matcherKeys(m *authorizationv1alpha1.WorkloadMatcher) (kind, []string) {
	switch {
	case m.AWS != nil:
		return kindAWS, m.AWS.Accounts
	case m.GCP != nil:
		return kindGCP, m.GCP.Projects
	case m.Azure != nil:
		return kindAzure, m.Azure.Tenants
	case m.ECS != nil:
		return kindECS, m.ECS.Accounts
	default:
		return kindJWT, []string{m.JWT.Issuer}
	}
}

// foldASCII returns s in lower case when s is ASCII: then strings.EqualFold
// equals comparing the lower-case forms. A string with other characters
// (whose case folding has more than two forms) is not folded.
func foldASCII(s string) (string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return "", false
		}
	}
	return strings.ToLower(s), true
}

// candidates returns, in evaluation order, the rules that could allow id:
// the only ones whose decision can be "allowed".
func (ix *Index) candidates(id runtimev1alpha1.WorkloadIdentity) []int {
	var lists [][]int
	look := func(k kind, v string) {
		if l := ix.byKey[indexKey{k, v}]; len(l) > 0 {
			lists = append(lists, l)
		}
	}
	if id.AWS != nil {
		look(kindAWS, id.AWS.Account)
	}
	if id.JWT != nil {
		look(kindJWT, id.JWT.Issuer)
	}
	if id.GCP != nil {
		look(kindGCP, id.GCP.ProjectID)
	}
	if id.ECS != nil {
		look(kindECS, id.ECS.Account)
	}
	if id.Azure != nil {
		if v, ok := foldASCII(id.Azure.TenantID); ok {
			look(kindAzure, v)
			if l := ix.unkeyed[kindAzure]; len(l) > 0 {
				lists = append(lists, l)
			}
		} else if l := ix.foldAll[kindAzure]; len(l) > 0 {
			lists = append(lists, l)
		}
	}
	switch len(lists) {
	case 0:
		return nil
	case 1:
		return lists[0]
	}
	var out []int
	for _, l := range lists {
		out = append(out, l...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// selects reports whether a target of rule r selects the labels, reporting
// the targets met before that whose selector is invalid to invalid (when
// not nil), as selectsGroup does.
func (r *indexedRule) selects(set labels.Set, invalid func(target int, err error)) bool {
	for i := range r.targets {
		t := &r.targets[i]
		if t.err != nil {
			if invalid != nil {
				invalid(i, t.err)
			}
			continue
		}
		if t.sel.Matches(set) {
			return true
		}
	}
	return false
}

// quick is what evaluating only the candidate rules tells.
type quick struct {
	allowed           bool
	allowedAt         int
	needsIAMRoleProof bool
	needsConfirmation bool
}

// evaluateCandidates evaluates the rules that could allow id, in order,
// up to the first that allows. A rule that fails only for want of a proven
// IAM role or of its platform's confirmation matches the identity's key, so
// it is among them: the flags are those of a full evaluation.
func (ix *Index) evaluateCandidates(set labels.Set, id runtimev1alpha1.WorkloadIdentity) quick {
	var q quick
	for _, pos := range ix.candidates(id) {
		r := &ix.rules[pos]
		_, dist, roleOnly, confirmOnly := closestWorkload(r.rule.Workloads, id)
		if dist != 0 && !roleOnly && !confirmOnly {
			continue
		}
		if !r.selects(set, nil) {
			continue
		}
		if dist == 0 {
			q.allowed, q.allowedAt = true, pos
			return q
		}
		q.needsIAMRoleProof = q.needsIAMRoleProof || roleOnly
		q.needsConfirmation = q.needsConfirmation || confirmOnly
	}
	return q
}

// allowedDecision is the Decision of a workload allowed by the rule at pos:
// its invalid selectors are those Evaluate meets in the rules up to it.
func (ix *Index) allowedDecision(d Decision, set labels.Set, pos int) Decision {
	d.Allowed = true
	r := &ix.rules[pos]
	d.AllowedBy = RuleRef{Policy: r.policy.Name, Rule: r.index}
	for _, bad := range ix.invalid {
		if bad > pos {
			break
		}
		br := &ix.rules[bad]
		br.selects(set, func(target int, err error) {
			d.InvalidSelectors = append(d.InvalidSelectors, InvalidSelector{
				RuleRef: RuleRef{Policy: br.policy.Name, Rule: br.index}, Target: target, Err: err,
			})
		})
	}
	return d
}

// Evaluate decides as the function Evaluate does over the policies of the
// Index, for a WorkloadGroup of its namespace: the same Decision. An
// allowed workload costs the evaluation of the rules listed under its
// identity's key; a denied one, of every rule (the message names the
// closest among all).
func (ix *Index) Evaluate(group GroupRef, id runtimev1alpha1.WorkloadIdentity) Decision {
	if group.Namespace != ix.namespace {
		return Decision{Group: group, Identity: id}
	}
	d := Decision{Group: group, Identity: id, Policies: len(ix.sorted)}
	if len(ix.sorted) == 0 {
		return d
	}
	set := labels.Set(group.Labels)
	if q := ix.evaluateCandidates(set, id); q.allowed {
		return ix.allowedDecision(d, set, q.allowedAt)
	}
	return evaluateSorted(ix.sorted, group, id)
}

// Precheck decides as Evaluate does, except for a denial that a proven
// IAM role (NeedsIAMRoleProof) or the platform API's confirmation
// (NeedsConfirmation) could turn into an allowance: such a Decision
// carries the flags but neither the closest rules nor the invalid
// selectors, which are only computed (from every rule) for a denial that
// stands. The endpoint goes on to get the proof or the confirmation and
// decides again, so the cost of a request that needs one is independent of
// the rules that cannot match it.
func (ix *Index) Precheck(group GroupRef, id runtimev1alpha1.WorkloadIdentity) Decision {
	if group.Namespace != ix.namespace {
		return Decision{Group: group, Identity: id}
	}
	d := Decision{Group: group, Identity: id, Policies: len(ix.sorted)}
	if len(ix.sorted) == 0 {
		return d
	}
	set := labels.Set(group.Labels)
	q := ix.evaluateCandidates(set, id)
	switch {
	case q.allowed:
		return ix.allowedDecision(d, set, q.allowedAt)
	case q.needsIAMRoleProof || q.needsConfirmation:
		d.NeedsIAMRoleProof, d.NeedsConfirmation = q.needsIAMRoleProof, q.needsConfirmation
		return d
	}
	return evaluateSorted(ix.sorted, group, id)
}

// RequiresIAMRoleProof is the function RequiresIAMRoleProof over the
// policies of the Index.
func (ix *Index) RequiresIAMRoleProof(group GroupRef) bool {
	if group.Namespace != ix.namespace {
		return false
	}
	set := labels.Set(group.Labels)
	for _, pos := range ix.roleRules {
		if ix.rules[pos].selects(set, nil) {
			return true
		}
	}
	return false
}

// AddressAllowed is the function AddressAllowed over the policies of the
// Index: only the rules that could allow id are looked at.
func (ix *Index) AddressAllowed(group GroupRef, id runtimev1alpha1.WorkloadIdentity, addr netip.Addr) bool {
	if group.Namespace != ix.namespace {
		return false
	}
	set := labels.Set(group.Labels)
	for _, pos := range ix.candidates(id) {
		r := &ix.rules[pos]
		if !cidrsHold(r.rule.AddressCIDRs, addr) {
			continue
		}
		if _, dist, _, _ := closestWorkload(r.rule.Workloads, id); dist == 0 && r.selects(set, nil) {
			return true
		}
	}
	return false
}
