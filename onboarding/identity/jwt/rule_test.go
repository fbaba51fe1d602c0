package jwt_test

import (
	"testing"

	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/jwt"
)

func TestRuleMatches(t *testing.T) {
	id := &identity.Identity{Method: identity.MethodJWT, JWT: &identity.JWTIdentity{
		Issuer: "https://idp.example.com", ShortName: "corp", Subject: "vm-1",
		Attributes: map[string]string{"region": "eu-west", "team": "ops"},
	}}
	tests := []struct {
		name string
		rule jwt.Rule
		id   *identity.Identity
		want bool
	}{
		{name: "issuer only", rule: jwt.Rule{Issuer: "https://idp.example.com"}, id: id, want: true},
		{name: "other issuer", rule: jwt.Rule{Issuer: "https://idp.example.org"}, id: id, want: false},
		{name: "no issuer matches nothing", rule: jwt.Rule{}, id: id, want: false},
		{name: "subject listed", rule: jwt.Rule{Issuer: "https://idp.example.com", Subjects: []string{"vm-0", "vm-1"}}, id: id, want: true},
		{name: "subject not listed", rule: jwt.Rule{Issuer: "https://idp.example.com", Subjects: []string{"vm-0"}}, id: id, want: false},
		{name: "subject match is exact", rule: jwt.Rule{Issuer: "https://idp.example.com", Subjects: []string{"VM-1"}}, id: id, want: false},
		{name: "attribute allowed", rule: jwt.Rule{Issuer: "https://idp.example.com", Attributes: map[string][]string{"region": {"us-east", "eu-west"}}}, id: id, want: true},
		{name: "attribute not allowed", rule: jwt.Rule{Issuer: "https://idp.example.com", Attributes: map[string][]string{"team": {"dev"}}}, id: id, want: false},
		{name: "every attribute must match", rule: jwt.Rule{Issuer: "https://idp.example.com", Attributes: map[string][]string{"region": {"eu-west"}, "team": {"admins"}}}, id: id, want: false},
		{name: "missing attribute", rule: jwt.Rule{Issuer: "https://idp.example.com", Attributes: map[string][]string{"tier": {"gold"}}}, id: id, want: false},
		{name: "empty allowed list matches nothing", rule: jwt.Rule{Issuer: "https://idp.example.com", Attributes: map[string][]string{"region": {}}}, id: id, want: false},
		{name: "all constraints", rule: jwt.Rule{Issuer: "https://idp.example.com", Subjects: []string{"vm-1"}, Attributes: map[string][]string{"region": {"eu-west"}, "team": {"ops"}}}, id: id, want: true},
		{name: "AWS identity", rule: jwt.Rule{Issuer: "https://idp.example.com"}, id: &identity.Identity{AWS: &identity.AWSIdentity{}}, want: false},
		{name: "nil identity", rule: jwt.Rule{Issuer: "https://idp.example.com"}, id: nil, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.rule.Matches(tt.id); got != tt.want {
				t.Errorf("Matches() = %v, want %v", got, tt.want)
			}
		})
	}
}
