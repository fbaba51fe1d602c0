package policy

import (
	"net/netip"
	"testing"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// A list stored as [] (admission refuses it, an old CRD may not) matches
// nothing; leaving the field out still means "any".
func TestEmptyListsMatchNothing(t *testing.T) {
	g := group("bookinfo", "ratings", "app", "ratings")
	tests := []struct {
		name        string
		doc         string
		id          runtimev1alpha1.WorkloadIdentity
		wantAllowed bool
	}{
		{name: "iamRoleNames unset: any role", doc: `{aws: {accounts: ['123456789012'], ec2: {}}}`, id: ec2("123456789012", "us-east-2", "us-east-2b", ""), wantAllowed: true},
		{name: "iamRoleNames: []", doc: `{aws: {accounts: ['123456789012'], ec2: {iamRoleNames: []}}}`, id: ec2("123456789012", "us-east-2", "us-east-2b", "any-role")},
		{name: "zones: []", doc: `{aws: {accounts: ['123456789012'], zones: []}}`, id: ec2("123456789012", "us-east-2", "us-east-2b", "")},
		{name: "subjects: []", doc: `{jwt: {issuer: 'https://idp', subjects: []}}`, id: jwtID("https://idp", "vm-1", nil)},
		{name: "subjects unset: any subject", doc: `{jwt: {issuer: 'https://idp'}}`, id: jwtID("https://idp", "vm-1", nil), wantAllowed: true},
		{name: "requireSTSProof without a proof", doc: `{aws: {accounts: ['123456789012'], ec2: {requireSTSProof: true}}}`, id: ec2("123456789012", "us-east-2", "us-east-2b", "")},
		{name: "requireSTSProof with a proof", doc: `{aws: {accounts: ['123456789012'], ec2: {requireSTSProof: true}}}`, id: ec2("123456789012", "us-east-2", "us-east-2b", "r"), wantAllowed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := policyYAML(t, `
metadata: {name: p, namespace: bookinfo}
spec:
  allow:
  - workloads: [`+tt.doc+`]
    onboardTo: [{workloadGroupSelector: {}}]
`)
			d := Evaluate([]authorizationv1alpha1.OnboardingPolicy{p}, g, tt.id)
			if d.Allowed != tt.wantAllowed {
				t.Errorf("Allowed = %v, want %v (%s)", d.Allowed, tt.wantAllowed, d.Message())
			}
		})
	}
}

func TestAddressAllowed(t *testing.T) {
	g := group("bookinfo", "ratings", "app", "ratings")
	p := policyYAML(t, `
metadata: {name: p, namespace: bookinfo}
spec:
  allow:
  - workloads: [{jwt: {issuer: 'https://idp'}}]
    onboardTo: [{workloadGroupSelector: {}}]
    addressCIDRs: ['192.0.2.0/24', '2001:db8::/64']
  - workloads: [{jwt: {issuer: 'https://other'}}]
    onboardTo: [{workloadGroupSelector: {}}]
`)
	tests := []struct {
		name string
		id   runtimev1alpha1.WorkloadIdentity
		addr string
		want bool
	}{
		{name: "listed", id: jwtID("https://idp", "vm", nil), addr: "192.0.2.7", want: true},
		{name: "listed IPv6", id: jwtID("https://idp", "vm", nil), addr: "2001:db8::20", want: true},
		{name: "outside", id: jwtID("https://idp", "vm", nil), addr: "198.51.100.1"},
		{name: "rule without addressCIDRs", id: jwtID("https://other", "vm", nil), addr: "192.0.2.7"},
		{name: "identity no rule allows", id: jwtID("https://third", "vm", nil), addr: "192.0.2.7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := AddressAllowed([]authorizationv1alpha1.OnboardingPolicy{p}, g, tt.id, netip.MustParseAddr(tt.addr)); got != tt.want {
				t.Errorf("AddressAllowed = %v, want %v", got, tt.want)
			}
		})
	}
}
