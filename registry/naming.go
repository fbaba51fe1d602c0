package registry

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

const (
	// hashLen is how many hex digits of a SHA-256 a shortened name keeps.
	hashLen = 10
	// jwtHashLen is how many hex digits of the issuer and subject's SHA-256
	// a JWT identity name carries.
	jwtHashLen = 16
	// minNameLen is the smallest length limit shorten honours.
	minNameLen = hashLen + 2
)

// RegistrationName returns the name of the WorkloadAutoRegistration of a
// workload: <workload-group>-<workload-identity>, e.g.
// ratings-aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0.
//
// The result is always a valid DNS-1123 subdomain of at most maxLen
// characters (validation.DNS1123SubdomainMaxLength when maxLen <= 0 or larger):
// characters outside [a-z0-9.-] become '-', and a name that is still invalid or
// too long is cut and suffixed with a hash of the full name, so different
// workloads never share a name and the same workload always gets the same one.
func RegistrationName(group, identity string, maxLen int) string {
	return Shorten(group+"-"+identity, maxLen)
}

// Name returns the name of the registration of the workload with the verified
// identity id in WorkloadGroup group: RegistrationName(group,
// IdentityName(id), 0). It is the one place both the onboarding token's
// subject (Authorize) and the registrar compute it; "" when id names no
// identity.
func Name(group string, id runtimev1alpha1.WorkloadIdentity) string {
	identity := IdentityName(id)
	if identity == "" {
		return ""
	}
	return RegistrationName(group, identity, 0)
}

// IdentityName returns the workload-identity part of a registration's name:
// aws-<partition>-<account>-<zone>-ec2-<instance-id> for EC2 instances,
// gcp-<project>-<zone>-gce-<instance-id> for Compute Engine instances,
// azure-<subscription>-<resource-group>-vm-<vm-name> for Azure VMs (IDs and
// names in lower case),
// aws-<partition>-<account>-<region>-ecs-<cluster>-<task-id> for ECS tasks,
// jwt-<issuer-short-name>-<subject>-<hash> for JWT identities, where <hash>
// is 16 hex digits of the SHA-256 of the issuer URL and the subject: short
// names and subjects may both contain '-' (corp/lab-host1 and
// corp-lab/host1 would otherwise share a name), and the hash also keeps a
// crafted subject from spelling out another subject's shortened name. It is
// "" for an identity with neither.
//
// Names are labels, not proofs: the endpoint compares the full verified
// identity, never the name, before acting on a registration.
func IdentityName(id runtimev1alpha1.WorkloadIdentity) string {
	switch {
	case id.AWS != nil && id.AWS.EC2 != nil:
		return strings.Join([]string{"aws", id.AWS.Partition, id.AWS.Account, id.AWS.Zone, "ec2", id.AWS.EC2.InstanceID}, "-")
	case id.AWS != nil:
		return strings.Join([]string{"aws", id.AWS.Partition, id.AWS.Account, id.AWS.Zone}, "-")
	case id.GCP != nil:
		return strings.Join([]string{"gcp", id.GCP.ProjectID, id.GCP.Zone, "gce", id.GCP.InstanceID}, "-")
	case id.Azure != nil:
		return strings.Join([]string{"azure", id.Azure.SubscriptionID, id.Azure.ResourceGroup, "vm", id.Azure.VMName}, "-")
	case id.ECS != nil:
		return strings.Join([]string{"aws", id.ECS.Partition, id.ECS.Account, id.ECS.Region, "ecs", id.ECS.Cluster, id.ECS.TaskID}, "-")
	case id.JWT != nil:
		sum := sha256.Sum256([]byte(id.JWT.Issuer + "\x00" + id.JWT.Subject))
		return "jwt-" + id.JWT.ShortName + "-" + id.JWT.Subject + "-" + hex.EncodeToString(sum[:])[:jwtHashLen]
	default:
		return ""
	}
}

// Shorten makes s a valid DNS-1123 subdomain of at most maxLen characters.
func Shorten(s string, maxLen int) string {
	if maxLen <= 0 || maxLen > validation.DNS1123SubdomainMaxLength {
		maxLen = validation.DNS1123SubdomainMaxLength
	}
	maxLen = max(maxLen, minNameLen)
	clean := sanitize(s)
	if len(clean) <= maxLen && clean == s && len(validation.IsDNS1123Subdomain(clean)) == 0 {
		return clean
	}
	// Changed or too long: append a hash of the original so that two inputs
	// that sanitize to the same text still get different names.
	sum := sha256.Sum256([]byte(s))
	suffix := hex.EncodeToString(sum[:])[:hashLen]
	keep := min(maxLen-hashLen-1, len(clean))
	head := strings.Trim(clean[:keep], ".-")
	if head == "" {
		return suffix
	}
	return head + "-" + suffix
}

// sanitize lowercases s and replaces every character a DNS-1123 subdomain
// cannot hold with '-', collapsing runs and trimming the ends, and keeps each
// dot-separated part non-empty.
func sanitize(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	prev := byte(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '.':
			if prev == '.' || prev == '-' || prev == 0 {
				continue
			}
		default:
			c = '-'
		}
		if c == '-' && (prev == '-' || prev == '.' || prev == 0) {
			continue
		}
		b.WriteByte(c)
		prev = c
	}
	return strings.Trim(b.String(), ".-")
}
