package registry

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/fixtures"
)

func TestRegistrationName(t *testing.T) {
	ec2 := fixtures.AWSIdentity(fixtures.InstanceID)
	tests := []struct {
		name     string
		group    string
		identity string
		maxLen   int
		want     string
	}{
		{
			name:  "documented example",
			group: "ratings", identity: IdentityName(ec2),
			want: "ratings-aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0",
		},
		{
			name:  "jwt identity with characters a name cannot hold",
			group: "ratings", identity: "jwt-corp-Host_01@DC1",
			want: "ratings-jwt-corp-host-01-dc1-" + hashOf("ratings-jwt-corp-Host_01@DC1"),
		},
		{
			name:  "over-long name is cut and suffixed with a hash",
			group: strings.Repeat("g", 200), identity: IdentityName(ec2),
			want: (strings.Repeat("g", 200) + "-" + IdentityName(ec2))[:253-hashLen-1] + "-" + hashOf(strings.Repeat("g", 200)+"-"+IdentityName(ec2)),
		},
		{
			name:  "shorter limit for derived names",
			group: "ratings", identity: IdentityName(ec2), maxLen: 40,
			want: "ratings-aws-aws-123456789012-" + hashOf("ratings-aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := RegistrationName(tt.group, tt.identity, tt.maxLen)
			if got != tt.want {
				t.Errorf("RegistrationName = %q, want %q", got, tt.want)
			}
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Errorf("%q is not a DNS-1123 subdomain: %v", got, errs)
			}
			if again := RegistrationName(tt.group, tt.identity, tt.maxLen); again != got {
				t.Errorf("not deterministic: %q then %q", got, again)
			}
		})
	}
}

func TestIdentityName(t *testing.T) {
	tests := []struct {
		name string
		id   runtimev1alpha1.WorkloadIdentity
		want string
	}{
		{name: "ec2", id: runtimev1alpha1.WorkloadIdentity{AWS: &runtimev1alpha1.AWSIdentity{Partition: "aws-cn", Account: "123456789012", Zone: "cn-north-1a", EC2: &runtimev1alpha1.EC2Identity{InstanceID: "i-0abc"}}}, want: "aws-aws-cn-123456789012-cn-north-1a-ec2-i-0abc"},
		{name: "jwt", id: runtimev1alpha1.WorkloadIdentity{JWT: &runtimev1alpha1.JWTIdentity{Issuer: "https://corp.example", ShortName: "corp", Subject: "host-1"}},
			want: "jwt-corp-host-1-" + fullHashOf("https://corp.example\x00host-1")[:16]},
		{name: "gce", id: runtimev1alpha1.WorkloadIdentity{GCP: &runtimev1alpha1.GCPIdentity{ProjectID: "embark-test", Zone: "us-central1-a", InstanceID: "5180367924151823417", InstanceName: "ratings-1"}},
			want: "gcp-embark-test-us-central1-a-gce-5180367924151823417"},
		{name: "azure", id: runtimev1alpha1.WorkloadIdentity{Azure: &runtimev1alpha1.AzureIdentity{TenantID: "72f988bf-86f1-41af-91ab-2d7cd011db47", SubscriptionID: "0b1f6471-1bf0-4dda-aec3-cb9272f09590", ResourceGroup: "embark-rg", VMName: "ratings-1"}},
			want: "azure-0b1f6471-1bf0-4dda-aec3-cb9272f09590-embark-rg-vm-ratings-1"},
		{name: "ecs", id: ecsIdentity("123456789012", "prod", "158d1c8083dd49d6b527399fd6414f5c"),
			want: "aws-aws-123456789012-us-east-2-ecs-prod-158d1c8083dd49d6b527399fd6414f5c"},
		{name: "ecs cluster name with capitals and underscores", id: ecsIdentity("123456789012", "Prod_EU", "abc"),
			want: "aws-aws-123456789012-us-east-2-ecs-Prod_EU-abc"},
		{name: "none", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IdentityName(tt.id); got != tt.want {
				t.Errorf("IdentityName = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestJWTIdentityNamesAreInjective: short names and subjects may both hold
// '-', so the plain concatenation of corp/lab-host1 and corp-lab/host1 is
// the same; the names must differ.
func TestJWTIdentityNamesAreInjective(t *testing.T) {
	a := IdentityName(runtimev1alpha1.WorkloadIdentity{JWT: &runtimev1alpha1.JWTIdentity{Issuer: "https://corp", ShortName: "corp", Subject: "lab-host1"}})
	b := IdentityName(runtimev1alpha1.WorkloadIdentity{JWT: &runtimev1alpha1.JWTIdentity{Issuer: "https://corp-lab", ShortName: "corp-lab", Subject: "host1"}})
	if a == b || RegistrationName("g", a, 0) == RegistrationName("g", b, 0) {
		t.Fatalf("corp/lab-host1 and corp-lab/host1 share the name %q", a)
	}
}

func fullHashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:hashLen]
}

func FuzzRegistrationName(f *testing.F) {
	f.Add("ratings", "aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0", 0)
	f.Add("", "", 0)
	f.Add("..--", "ÄÖ..x", 12)
	f.Add(strings.Repeat("a", 300), "b", 63)
	f.Fuzz(func(t *testing.T, group, identity string, maxLen int) {
		if maxLen < 0 || maxLen > 300 {
			maxLen = 0
		}
		if maxLen > 0 && maxLen < minNameLen {
			maxLen = minNameLen
		}
		got := RegistrationName(group, identity, maxLen)
		if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
			t.Fatalf("RegistrationName(%q, %q, %d) = %q: %v", group, identity, maxLen, got, errs)
		}
		limit := maxLen
		if limit == 0 {
			limit = validation.DNS1123SubdomainMaxLength
		}
		if len(got) > limit {
			t.Fatalf("RegistrationName(%q, %q, %d) = %q is longer than %d", group, identity, maxLen, got, limit)
		}
	})
}

// TestJWTRegistrationName pins the registration names of on-prem hosts as
// docs/identity.md states them: <group>-jwt-<shortName>-<subject>-<h>, h
// the first 16 hex digits of SHA-256(issuer NUL subject) (in a shell:
// printf '%s\0%s' ISSUER SUBJECT | sha256sum | cut -c1-16); host-name
// subjects keep their dots; a subject a DNS-1123 subdomain cannot hold
// verbatim is lower-cased and sanitized, and the name gets a second suffix,
// 10 hex digits of the SHA-256 of the unsanitized name.
func TestJWTRegistrationName(t *testing.T) {
	const issuer = "https://kubernetes.corp.example.com"
	tests := []struct {
		name    string
		subject string
		want    string
	}{
		{name: "host name", subject: "vm-01.example.com", want: "ratings-jwt-corp-vm-01.example.com-123e8162634dbac0"},
		{name: "deeper host name", subject: "db-1.eu-west.corp.example.com", want: "ratings-jwt-corp-db-1.eu-west.corp.example.com-31e9f7473205d989"},
		{name: "upper case", subject: "VM-02.Example.COM", want: "ratings-jwt-corp-vm-02.example.com-b14c20b1d6e3714d-09d67b82d7"},
		{name: "characters a name cannot hold", subject: "host_01@dc1", want: "ratings-jwt-corp-host-01-dc1-5d5a2ee9b675fa7c-9a3ee0a57d"},
		{name: "trailing dot", subject: "vm-01.example.com.", want: "ratings-jwt-corp-vm-01.example.com.a5853cb1207bb600-517b787973"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := runtimev1alpha1.WorkloadIdentity{JWT: &runtimev1alpha1.JWTIdentity{Issuer: issuer, ShortName: "corp", Subject: tt.subject}}
			got := RegistrationName("ratings", IdentityName(id), 0)
			if got != tt.want {
				t.Errorf("registration name of %q = %q, want %q", tt.subject, got, tt.want)
			}
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Errorf("%q is not a DNS-1123 subdomain: %v", got, errs)
			}
		})
	}
}

// Name is the one computation of a registration's name, shared by the
// onboarding token (Authorize) and the registrar.
func TestName(t *testing.T) {
	tests := []struct {
		name  string
		group string
		id    runtimev1alpha1.WorkloadIdentity
		want  string
	}{
		{name: "documented EC2 identity", group: "ratings", id: fixtures.AWSIdentity("i-1234567890abcdef0"), want: seedName},
		{name: "no identity", group: "ratings", id: runtimev1alpha1.WorkloadIdentity{}, want: ""},
		{name: "ecs task", group: "ratings", id: ecsIdentity("123456789012", "prod", "158d1c8083dd49d6b527399fd6414f5c"),
			want: "ratings-aws-aws-123456789012-us-east-2-ecs-prod-158d1c8083dd49d6b527399fd6414f5c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Name(tt.group, tt.id); got != tt.want {
				t.Errorf("Name(%q) = %q, want %q", tt.group, got, tt.want)
			}
		})
	}
}
