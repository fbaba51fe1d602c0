package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +genclient
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,categories=onboarding,shortName=obp
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Groups",type=integer,JSONPath=`.status.selectedWorkloadGroupCount`,description="WorkloadGroups the rules currently select"
// +kubebuilder:printcolumn:name="Accounts",type=string,JSONPath=`.spec.allow[*].workloads[*].aws.accounts`,description="AWS accounts the rules allow"
// +kubebuilder:printcolumn:name="Projects",type=string,JSONPath=`.spec.allow[*].workloads[*].gcp.projects`,description="GCP projects the rules allow"
// +kubebuilder:printcolumn:name="Subscriptions",type=string,JSONPath=`.spec.allow[*].workloads[*].azure.subscriptions`,description="Azure subscriptions the rules allow"
// +kubebuilder:printcolumn:name="Issuers",type=string,JSONPath=`.spec.allow[*].workloads[*].jwt.issuer`,description="JWT issuers the rules allow"
// +kubebuilder:printcolumn:name="Last Allowed",type=date,JSONPath=`.status.lastAllowedTime`,description="When a rule of this policy last allowed a workload"
// +kubebuilder:printcolumn:name="Last Denied",type=date,JSONPath=`.status.lastDeniedTime`,description="When a workload was last denied joining a WorkloadGroup this policy selects"
// +kubebuilder:printcolumn:name="Selected",type=string,JSONPath=`.status.selectedWorkloadGroups`,priority=1,description="Names of the WorkloadGroups selected"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// OnboardingPolicy authorizes workloads with a verified platform identity to
// join WorkloadGroups in the policy's own namespace. Onboarding is denied by
// default: a workload joins a WorkloadGroup only when some rule of some policy
// in that namespace matches both its identity and the group.
type OnboardingPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec holds the allow rules.
	Spec OnboardingPolicySpec `json:"spec"`
	// Status is what the onboarding endpoint observes of the policy: the
	// WorkloadGroups it selects and when it last allowed or denied.
	// +optional
	Status OnboardingPolicyStatus `json:"status,omitempty"`
}

// MaxListedWorkloadGroups bounds OnboardingPolicyStatus.SelectedWorkloadGroups.
const MaxListedWorkloadGroups = 64

// OnboardingPolicyStatus is written by the onboarding endpoint (a
// level-based reconciler, only when it changes, rate-limited).
type OnboardingPolicyStatus struct {
	// ObservedGeneration is the spec generation the selection was computed
	// from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// SelectedWorkloadGroups names, sorted, the WorkloadGroups of the
	// policy's namespace that an onboardTo selector of a rule currently
	// selects: the groups the policy can let workloads join. At most
	// MaxListedWorkloadGroups (64) names; SelectedWorkloadGroupCount counts
	// them all.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	SelectedWorkloadGroups []string `json:"selectedWorkloadGroups,omitempty"`
	// SelectedWorkloadGroupCount is the number of WorkloadGroups selected.
	// +optional
	SelectedWorkloadGroupCount int32 `json:"selectedWorkloadGroupCount"`
	// LastAllowedTime is when a rule of this policy last allowed a workload
	// to onboard (to the second; written at most once per 30 seconds per
	// endpoint replica).
	// +optional
	LastAllowedTime *metav1.Time `json:"lastAllowedTime,omitempty"`
	// LastDeniedTime is when a workload was last denied joining a
	// WorkloadGroup this policy selects (no rule of any policy of the
	// namespace allowed it; the WorkloadGroup's OnboardingDenied Event says
	// why). Same precision and rate as LastAllowedTime.
	// +optional
	LastDeniedTime *metav1.Time `json:"lastDeniedTime,omitempty"`
}

// OnboardingPolicySpec is a list of allow rules; a workload is allowed when
// any rule allows it.
type OnboardingPolicySpec struct {
	// Allow rules. Each rule allows the workloads it matches to join the
	// WorkloadGroups it selects.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	Allow []AllowRule `json:"allow"`
}

// AllowRule allows workloads matching any of Workloads to join any
// WorkloadGroup selected by OnboardTo.
type AllowRule struct {
	// Workloads are the identities this rule allows.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	Workloads []WorkloadMatcher `json:"workloads"`
	// OnboardTo selects the WorkloadGroups (in the policy's namespace) the
	// workloads may join.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	OnboardTo []OnboardTarget `json:"onboardTo"`
	// AddressCIDRs lets the workloads of this rule register workload
	// addresses that their identity does not prove: an EC2 instance's
	// INTERNET (public) address or a VPC address other than the signed
	// privateIp of its instance identity document, and any address of a
	// host onboarded with a JWT or a GCE instance identity token (neither
	// proves an address). Each entry is a CIDR (e.g. 203.0.113.0/24,
	// 2001:db8::/64, or 192.0.2.7/32 for one address). Unset: only proven
	// addresses (an EC2 instance's document privateIp) are accepted. An
	// address allowed only by this field is never used to fence another
	// registration: a registration holding it is refused instead.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	AddressCIDRs []CIDR `json:"addressCIDRs,omitempty"`
}

// CIDR is an IPv4 or IPv6 prefix in canonical form, e.g. 10.0.0.0/16.
// +kubebuilder:validation:MaxLength=49
// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self).masked() == cidr(self)",message="must be a CIDR with no bits set after the prefix, e.g. 10.0.0.0/16"
type CIDR string

// WorkloadMatcher matches verified workload identities. Exactly one member is
// set.
// +kubebuilder:validation:XValidation:rule="(has(self.aws) ? 1 : 0) + (has(self.jwt) ? 1 : 0) + (has(self.gcp) ? 1 : 0) + (has(self.azure) ? 1 : 0) + (has(self.ecs) ? 1 : 0) == 1",message="exactly one of aws, jwt, gcp, azure or ecs must be set"
type WorkloadMatcher struct {
	// AWS matches workloads running on AWS compute.
	// +optional
	AWS *AWSMatcher `json:"aws,omitempty"`
	// JWT matches workloads that present a JWT from a trusted issuer.
	// +optional
	JWT *JWTMatcher `json:"jwt,omitempty"`
	// GCP matches Google Compute Engine instances.
	// +optional
	GCP *GCPMatcher `json:"gcp,omitempty"`
	// Azure matches Azure virtual machines.
	// +optional
	Azure *AzureMatcher `json:"azure,omitempty"`
	// ECS matches AWS ECS tasks. aws rules never match ECS tasks.
	// +optional
	ECS *ECSMatcher `json:"ecs,omitempty"`
}

// AzureMatcher matches Azure virtual machines by their managed identity
// token. Every field that is set must match; an unset list matches any
// value, except Tenants and Subscriptions, which must always be listed
// explicitly. A list that is present but empty is refused at admission (and
// matches nothing if stored anyway). Locations match only VMs Azure
// Resource Manager confirmed (the endpoint's identity.azure.vmCheck): the
// token carries no location.
type AzureMatcher struct {
	// Tenants the VM's managed identity may belong to, by tenant ID. There
	// is no wildcard.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +kubebuilder:validation:items:Pattern=`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
	Tenants []string `json:"tenants"`
	// Subscriptions the VM may belong to, by subscription ID. There is no
	// wildcard.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	// +listType=set
	// +kubebuilder:validation:items:Pattern=`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
	Subscriptions []string `json:"subscriptions"`
	// ResourceGroups the VM may be in, compared without case (as Azure
	// does); unset means any.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	// +listType=set
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=90
	ResourceGroups []string `json:"resourceGroups,omitempty"`
	// Locations the VM may be in (Azure regions, e.g. westeurope), compared
	// without case; unset means any. A rule naming locations matches only
	// VMs Azure Resource Manager confirmed (identity.azure.vmCheck).
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	Locations []string `json:"locations,omitempty"`
}

// ECSMatcher matches AWS ECS tasks by their task role session. Every field
// that is set must match; an unset list matches any value, except Accounts,
// which must always be listed explicitly. A list that is present but empty is
// refused at admission (and matches nothing if stored anyway). Regions, Zones
// and Clusters match only tasks the ECS API confirmed (the endpoint's
// identity.ecs.taskCheck): without it they are the agent's claim.
type ECSMatcher struct {
	// Accounts the task role may belong to, as 12-digit AWS account IDs.
	// There is no wildcard.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	// +listType=set
	// +kubebuilder:validation:items:Pattern=`^[0-9]{12}$`
	Accounts []string `json:"accounts"`
	// Regions the task may be in, e.g. us-east-2; unset means any.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +kubebuilder:validation:items:Pattern=`^[a-z]{2,4}(-[a-z]+)+-[0-9]+$`
	Regions []string `json:"regions,omitempty"`
	// Zones the task may be in, e.g. us-east-2b; unset means any.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=128
	// +listType=set
	// +kubebuilder:validation:items:Pattern=`^[a-z]{2,4}(-[a-z0-9]+)+$`
	Zones []string `json:"zones,omitempty"`
	// Clusters the task may run in, by cluster name; unset means any.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +kubebuilder:validation:items:Pattern=`^[a-zA-Z0-9_-]{1,255}$`
	Clusters []string `json:"clusters,omitempty"`
	// TaskRoles the task's IAM role (by name) must be one of; unset means
	// any. STS proves the role.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +kubebuilder:validation:items:Pattern=`^[\w+=,.@-]{1,64}$`
	TaskRoles []string `json:"taskRoles,omitempty"`
}

// GCPMatcher matches Compute Engine instances by their instance identity
// token. Every field that is set must match; an unset list matches any
// value, except Projects, which must always be listed explicitly. A list
// that is present but empty is refused at admission (and matches nothing if
// stored anyway).
type GCPMatcher struct {
	// Projects the instance may belong to, by project ID. For security
	// reasons projects are always listed explicitly: there is no wildcard.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	// +listType=set
	// +kubebuilder:validation:items:Pattern=`^[a-z][-a-z0-9]{4,28}[a-z0-9]$`
	Projects []string `json:"projects"`
	// Zones the instance may be in, e.g. us-central1-a; unset means any.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=128
	// +listType=set
	// +kubebuilder:validation:items:Pattern=`^[a-z]+-[a-z]+[0-9]+-[a-z]$`
	Zones []string `json:"zones,omitempty"`
	// ServiceAccounts the instance's service account (by email) must be
	// one of; unset means any.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +kubebuilder:validation:items:MinLength=3
	// +kubebuilder:validation:items:MaxLength=254
	ServiceAccounts []string `json:"serviceAccounts,omitempty"`
	// InstanceNamePatterns the instance's name must match one of, as
	// path.Match patterns (e.g. ratings-*); unset means any. Names are
	// chosen by whoever creates the instance in the project: a pattern
	// narrows a rule, it does not prove anything on its own.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=63
	InstanceNamePatterns []string `json:"instanceNamePatterns,omitempty"`
}

// AWSPartition is an AWS partition.
// +kubebuilder:validation:Enum=aws;aws-cn;aws-us-gov;aws-eusc;aws-iso;aws-iso-b;aws-iso-e;aws-iso-f
type AWSPartition string

// AWSMatcher matches AWS identities. Every field that is set must match; an
// unset list matches any value, except Accounts, which must always be listed
// explicitly. A list that is present but empty is refused at admission (and
// matches nothing if stored anyway): "[]" never means "anything".
type AWSMatcher struct {
	// Partitions the workload may be in; unset means any.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +listType=set
	Partitions []AWSPartition `json:"partitions,omitempty"`
	// Accounts the workload may belong to, as 12-digit AWS account IDs. For
	// security reasons accounts are always listed explicitly: there is no
	// wildcard.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	// +listType=set
	// +kubebuilder:validation:items:Pattern=`^[0-9]{12}$`
	Accounts []string `json:"accounts"`
	// Regions the workload may be in, e.g. us-east-2; unset means any.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +kubebuilder:validation:items:Pattern=`^[a-z]{2,4}(-[a-z]+)+-[0-9]+$`
	Regions []string `json:"regions,omitempty"`
	// Zones the workload may be in, e.g. us-east-2b; unset means any.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=128
	// +listType=set
	// +kubebuilder:validation:items:Pattern=`^[a-z]{2,4}(-[a-z0-9]+)+$`
	Zones []string `json:"zones,omitempty"`
	// EC2 restricts the rule to EC2 instances; `ec2: {}` matches any EC2
	// instance in the accounts above. When unset, the rule matches any AWS
	// compute the endpoint can verify (today: EC2 instances).
	// +optional
	EC2 *EC2Matcher `json:"ec2,omitempty"`
}

// EC2Matcher matches EC2 instances.
type EC2Matcher struct {
	// IAMRoleNames the instance's IAM role must be one of; unset means any
	// (an explicitly empty list is refused at admission and, if stored
	// anyway, matches nothing). When set, the agent must prove the role
	// with a signed sts:GetCallerIdentity request.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +kubebuilder:validation:items:Pattern=`^[\w+=,.@-]{1,64}$`
	IAMRoleNames []string `json:"iamRoleNames,omitempty"`
	// RequireSTSProof requires the instance to prove its IAM role session
	// with a signed sts:GetCallerIdentity request (any role unless
	// IAMRoleNames is set). Default false: the signed instance identity
	// document alone is enough to onboard (a rule of just `ec2: {}`), but such
	// document-only onboarding can never take over an existing
	// registration (see docs/security.md).
	// +optional
	RequireSTSProof bool `json:"requireSTSProof,omitempty"`
}

// JWTMatcher matches hosts presenting a JWT from a trusted OIDC issuer (one
// configured in the onboarding endpoint).
type JWTMatcher struct {
	// Issuer is the token's exact issuer (iss).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	Issuer string `json:"issuer"`
	// Subjects the token's subject (sub) must be one of; unset means any.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	// +listType=set
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=1024
	Subjects []string `json:"subjects,omitempty"`
	// Attributes the token must carry: each named attribute (as the endpoint
	// configuration extracts it) must have one of the listed values.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +listType=map
	// +listMapKey=name
	Attributes []JWTAttributeMatcher `json:"attributes,omitempty"`
}

// JWTAttributeMatcher requires a token attribute to have one of some values.
type JWTAttributeMatcher struct {
	// Name of the attribute.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// Values the attribute may have.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	// +listType=set
	Values []string `json:"values"`
}

// OnboardTarget selects WorkloadGroups in the policy's namespace.
type OnboardTarget struct {
	// WorkloadGroupSelector selects WorkloadGroups by their labels; `{}`
	// selects every WorkloadGroup in the namespace.
	WorkloadGroupSelector metav1.LabelSelector `json:"workloadGroupSelector"`
}

// +kubebuilder:object:root=true

// OnboardingPolicyList is a list of OnboardingPolicies.
type OnboardingPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []OnboardingPolicy `json:"items"`
}
