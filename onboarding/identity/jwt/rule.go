package jwt

import (
	"slices"

	"github.com/embark-mesh/embark/onboarding/identity"
)

// Rule is the jwt{issuer, subjects, attributes} selector of an
// OnboardingPolicy.
type Rule struct {
	// Issuer must equal the identity's issuer. A rule without an issuer
	// matches nothing: policies deny by default.
	Issuer string
	// Subjects, if not empty, must contain the identity's subject exactly.
	// Empty means any subject of the issuer.
	Subjects []string
	// Attributes maps an attribute name to its allowed values: for every
	// entry, the identity must have that attribute and its value must be in
	// the list (so an entry with an empty list matches nothing).
	Attributes map[string][]string
}

// Matches reports whether the verified identity id satisfies r.
func (r Rule) Matches(id *identity.Identity) bool {
	if id == nil || id.JWT == nil || r.Issuer == "" {
		return false
	}
	j := id.JWT
	if j.Issuer != r.Issuer {
		return false
	}
	if len(r.Subjects) > 0 && !slices.Contains(r.Subjects, j.Subject) {
		return false
	}
	for name, allowed := range r.Attributes {
		v, ok := j.Attributes[name]
		if !ok || !slices.Contains(allowed, v) {
			return false
		}
	}
	return true
}
