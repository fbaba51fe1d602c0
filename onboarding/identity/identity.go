package identity

import (
	"slices"
	"strings"
	"time"
)

// Method says how an identity was proven.
type Method string

const (
	// MethodAWSInstanceIdentityDocument is an EC2 instance identity document
	// with a valid RSA-2048 PKCS#7 signature of AWS.
	MethodAWSInstanceIdentityDocument Method = "aws-ec2-instance-identity-document"
	// MethodAWSInstanceIdentityDocumentAndSTS is the same, plus a signed
	// sts:GetCallerIdentity request answered with the instance's role
	// session.
	MethodAWSInstanceIdentityDocumentAndSTS Method = "aws-ec2-instance-identity-document+sts-get-caller-identity"
	// MethodJWT is a JWT of a configured OIDC issuer.
	MethodJWT Method = "jwt"
	// MethodGCEInstanceIdentityToken is a Google Compute Engine instance
	// identity token (format=full) signed by Google.
	MethodGCEInstanceIdentityToken Method = "gce-instance-identity-token"
	// MethodAzureManagedIdentityToken is an Azure VM's system-assigned
	// managed identity token (an Entra ID access token) signed by Microsoft.
	MethodAzureManagedIdentityToken Method = "azure-managed-identity-token"
	// MethodECSTaskRole is a signed sts:GetCallerIdentity request answered
	// with an ECS task's task role session, optionally confirmed with ECS
	// DescribeTasks.
	MethodECSTaskRole Method = "aws-ecs-task-role+sts-get-caller-identity"
)

// Identity is a verified workload identity. Exactly one of AWS, JWT, GCE,
// Azure and ECS is set. Verifiers fill it; nothing else should construct one from
// unverified input.
type Identity struct {
	// Method says how the identity was proven.
	Method Method
	// AWS is set for identities proven by the AWS verifier.
	AWS *AWSIdentity
	// JWT is set for identities proven by the JWT verifier.
	JWT *JWTIdentity
	// GCE is set for identities proven by the GCE verifier.
	GCE *GCEIdentity
	// Azure is set for identities proven by the Azure verifier.
	Azure *AzureIdentity
	// ECS is set for identities proven by the ECS verifier.
	ECS *ECSIdentity
}

// ECSIdentity holds the verified facts about an ECS task.
type ECSIdentity struct {
	// Partition and Account are the task role's, as STS answered.
	Partition string
	Account   string
	// Region, Zone and Cluster (a name) are the task's.
	Region  string
	Zone    string
	Cluster string
	// TaskARN and TaskID name the task; TaskID is the role session's name.
	TaskARN string
	TaskID  string
	// TaskRole is the name of the task role, as STS answered.
	TaskRole string
	// CallerARN is the ARN STS answered with.
	CallerARN string
	// Family and Revision name the task definition.
	Family   string
	Revision string
	// Address is the private IPv4 address of the task's ENI; set only when
	// TaskConfirmed (the ECS API reported it).
	Address string
	// TaskConfirmed says the ECS API confirmed the task (RUNNING, in
	// Cluster and Zone, with TaskRole and Address). Without it Region,
	// Zone, Cluster, Family and Revision are the agent's claim, consistent
	// with the task ARN and the role session.
	TaskConfirmed bool
}

// AWSIdentity holds the verified facts about an EC2 instance.
type AWSIdentity struct {
	// Partition is derived from Region: aws, aws-cn, aws-us-gov, aws-eusc,
	// aws-iso, aws-iso-b, aws-iso-e or aws-iso-f.
	Partition string
	// Account is the 12-digit AWS account ID.
	Account string
	// Region is the document's region, e.g. us-east-2.
	Region string
	// Zone is the document's availability zone, e.g. us-east-2b.
	Zone string
	// InstanceID is the EC2 instance ID, e.g. i-1234567890abcdef0.
	InstanceID string
	// InstanceType, ImageID, PrivateIP and PendingTime are copied from the
	// signed document for information; they are not used for trust.
	InstanceType string
	ImageID      string
	PrivateIP    string
	PendingTime  time.Time
	// STSProven says whether a signed sts:GetCallerIdentity request proved
	// the instance's IAM role in this verification.
	STSProven bool
	// IAMRole is the name of the instance's IAM role; set only when
	// STSProven.
	IAMRole string
	// CallerARN is the ARN STS answered with; set only when STSProven.
	CallerARN string
}

// JWTIdentity holds the verified facts of an OIDC token.
type JWTIdentity struct {
	// Issuer is the token's iss, equal to a configured issuer URL.
	Issuer string
	// ShortName is the configured short name of the issuer, used in names.
	ShortName string
	// Subject is the token's sub.
	Subject string
	// Attributes are the values extracted from the token's claims by the
	// issuer's configured attribute paths: strings as they are, numbers and
	// booleans in their JSON text. A claim that is absent, null, an object
	// or an array gives no attribute.
	Attributes map[string]string
	// Expiry is the token's exp.
	Expiry time.Time
}

// GCEIdentity holds the verified facts of a Compute Engine instance identity
// token: its google.compute_engine claims and its service account.
type GCEIdentity struct {
	// ProjectID is the project's ID, e.g. my-project.
	ProjectID string
	// ProjectNumber is the project's number, e.g. 123456789012.
	ProjectNumber string
	// Zone is the instance's zone, e.g. us-central1-a.
	Zone string
	// InstanceID is the instance's numeric ID.
	InstanceID string
	// InstanceName is the instance's name.
	InstanceName string
	// InstanceCreation is when the instance was created.
	InstanceCreation time.Time
	// ServiceAccount is the email of the instance's service account (the
	// token's verified email claim).
	ServiceAccount string
	// Expiry is the token's exp.
	Expiry time.Time
	// Address is the internal address (networkIP) of the instance's
	// primary network interface (nic0); set only when InstanceConfirmed
	// (the Compute API reported it).
	Address string
	// InstanceConfirmed says the Compute API confirmed the instance: it
	// exists under the token's name with the token's numeric ID and is
	// RUNNING.
	InstanceConfirmed bool
}

// AzureIdentity holds the verified facts of an Azure VM's managed identity
// token: its tenant (tid), the VM's resource ID (xms_mirid) and the object
// ID of the VM's system-assigned identity (oid). The token carries no
// location and no address: Location, VMID and Address are set only when
// Azure Resource Manager confirmed the VM (VMConfirmed).
type AzureIdentity struct {
	// TenantID is the Entra ID tenant, a GUID in lower case.
	TenantID string
	// SubscriptionID is the VM's subscription, a GUID in lower case.
	SubscriptionID string
	// ResourceGroup is the VM's resource group, in lower case (Azure
	// resource group names are case-insensitive).
	ResourceGroup string
	// VMName is the VM's name, in lower case (case-insensitive in Azure).
	VMName string
	// PrincipalID is the object ID of the VM's system-assigned managed
	// identity (oid), a GUID in lower case: a VM deleted and created again
	// under the same name gets another one.
	PrincipalID string
	// ResourceID is the token's xms_mirid as signed.
	ResourceID string
	// Expiry is the token's exp.
	Expiry time.Time
	// Location is the VM's Azure region (e.g. westeurope), as Azure
	// Resource Manager reports it; set only when VMConfirmed.
	Location string
	// VMID is the VM's unique ID (properties.vmId); set only when
	// VMConfirmed.
	VMID string
	// Address is the private IPv4 address of the primary IP configuration
	// of the VM's primary network interface; set only when VMConfirmed.
	Address string
	// VMConfirmed says Azure Resource Manager confirmed the VM: it exists,
	// provisioned, with the token's principal as its system-assigned
	// identity.
	VMConfirmed bool
}

// CheckIAMRole is the check a policy with ec2.iamRoleNames makes: the
// identity must carry an STS proof of its IAM role (ReasonSTSProofRequired
// otherwise) and the role must be one of allowed (ReasonRoleMismatch
// otherwise). An empty allowed list requires the proof but accepts any role.
func (id *Identity) CheckIAMRole(allowed []string) error {
	if id == nil || id.AWS == nil {
		return Refuse(ReasonSTSProofRequired, "not an AWS identity: an IAM role can only be proven by an EC2 instance")
	}
	if !id.AWS.STSProven || id.AWS.IAMRole == "" {
		return Refuse(ReasonSTSProofRequired, "instance %s presented no signed sts:GetCallerIdentity request; the policy requires proof of its IAM role", id.AWS.InstanceID)
	}
	if len(allowed) > 0 && !slices.Contains(allowed, id.AWS.IAMRole) {
		return Refuse(ReasonRoleMismatch, "instance %s has IAM role %q, the policy allows only %s", id.AWS.InstanceID, id.AWS.IAMRole, strings.Join(allowed, ", "))
	}
	return nil
}

// SanitizeDNSLabel maps s to DNS-1123 label characters: it lowercases,
// replaces every run of characters outside [a-z0-9-] with one '-', collapses
// runs of '-' and trims '-' at both ends. It does not shorten s.
func SanitizeDNSLabel(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	dash := false
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			dash = false
			continue
		}
		if !dash {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.Trim(b.String(), "-")
}
