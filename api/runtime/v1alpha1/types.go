package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// Condition types of a WorkloadAutoRegistration.
const (
	// ConditionAgentConnected is True while the workload's sidecar holds an ADS
	// stream to an onboarding endpoint replica.
	ConditionAgentConnected = "AgentConnected"
	// ConditionWorkloadGroupOutOfDate is True when the WorkloadGroup's spec no
	// longer equals the snapshot held by the registration.
	ConditionWorkloadGroupOutOfDate = "WorkloadGroupOutOfDate"
	// ConditionFenced is True when the registration lost its WorkloadEntry to a
	// newer registration holding the same address on the same network.
	ConditionFenced = "Fenced"
	// ConditionHealthy mirrors the workload's readiness probe (the
	// WorkloadGroup's spec.probe, run by the sidecar): True while it passes,
	// False while it fails. Unset until the first report.
	ConditionHealthy = "Healthy"
	// ConditionConfigurationEnforced is False while a policy selecting the
	// workload (an AuthorizationPolicy or RequestAuthentication) is not
	// enforced by the standalone configuration it is served, so its inbound
	// listeners refuse all traffic; the message names the policies. True
	// once everything selecting it is enforced again. Unset means nothing
	// was ever left unenforced.
	ConditionConfigurationEnforced = "ConfigurationEnforced"
	// ConditionNetworkTopology says whether the workload's network, as its
	// WorkloadGroup sets it, fits the mesh's networks (docs/multi-network.md):
	// False names what does not (a network with no gateway, a network label
	// that contradicts the group, an address in the pods' CIDR on another
	// network). Written only where the endpoint is configured with the
	// mesh's networks (mesh.network), or when the group contradicts itself.
	ConditionNetworkTopology = "NetworkTopology"
)

// Condition reasons of a WorkloadAutoRegistration.
const (
	// ReasonAgentEstablishedConnection: the sidecar opened its first ADS stream.
	ReasonAgentEstablishedConnection = "AgentEstablishedConnection"
	// ReasonAgentDisconnected: the sidecar's last ADS stream closed.
	ReasonAgentDisconnected = "AgentDisconnected"
	// ReasonAgentNeverConnected: registered, but no ADS stream was seen yet.
	ReasonAgentNeverConnected = "AgentNeverConnected"
	// ReasonProbeSucceeded: the sidecar reported the readiness probe passing.
	ReasonProbeSucceeded = "ProbeSucceeded"
	// ReasonProbeFailed: the sidecar reported the readiness probe failing.
	ReasonProbeFailed = "ProbeFailed"
	// ReasonUnsupportedPolicy: a policy selecting the workload is not
	// enforced; its inbound traffic is refused (ConfigurationEnforced=False).
	ReasonUnsupportedPolicy = "UnsupportedPolicy"
	// ReasonPoliciesEnforced: every policy selecting the workload is
	// enforced (ConfigurationEnforced=True).
	ReasonPoliciesEnforced = "PoliciesEnforced"
)

// AddressType says how a host address can be reached.
// +kubebuilder:validation:Enum=VPC;INTERNET
type AddressType string

const (
	// AddressTypeVPC is an address reachable inside the host's private network.
	AddressTypeVPC AddressType = "VPC"
	// AddressTypeInternet is a public address.
	AddressTypeInternet AddressType = "INTERNET"
)

// +genclient
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=war,categories=onboarding
// +kubebuilder:printcolumn:name="Agent Connected",type=string,JSONPath=`.status.conditions[?(@.type=="AgentConnected")].status`,description="Whether the workload's sidecar is connected to an onboarding endpoint"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Healthy",type=string,JSONPath=`.status.conditions[?(@.type=="Healthy")].status`,priority=1,description="Whether the workload's readiness probe (the WorkloadGroup's spec.probe) passes"
// +kubebuilder:printcolumn:name="Group",type=string,JSONPath=`.spec.workloadGroup.name`,priority=1,description="The WorkloadGroup the workload joined"
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.spec.registration.host.addresses[0].ip`,priority=1,description="The workload's first host address"
// +kubebuilder:printcolumn:name="Replica",type=string,JSONPath=`.status.connection.replica`,priority=1,description="The endpoint replica holding the workload's connection"
// +kubebuilder:printcolumn:name="Agent Version",type=string,JSONPath=`.status.agent.version`,priority=1,description="The onboarding agent's version, as it last reported"
// +kubebuilder:printcolumn:name="Last Error",type=string,JSONPath=`.status.agent.lastError.reason`,priority=1,description="The reason of the agent's last failed onboarding attempt, as it last reported"

// WorkloadAutoRegistration is one workload (a VM or bare-metal host) onboarded
// into the mesh. It is named <workload-group>-<workload-identity>, lives in the
// WorkloadGroup's namespace and is owned by that WorkloadGroup. Deleting it makes
// the workload's agent onboard again, taking a fresh WorkloadGroup snapshot.
type WorkloadAutoRegistration struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the verified identity, the registration details and the
	// WorkloadGroup snapshot. It is written once by the onboarding endpoint.
	Spec WorkloadAutoRegistrationSpec `json:"spec"`
	// Status is the workload's connection state, written by the endpoint replica
	// holding its connection.
	// +optional
	Status WorkloadAutoRegistrationStatus `json:"status,omitempty"`
}

// WorkloadAutoRegistrationSpec is what is known about an onboarded workload.
type WorkloadAutoRegistrationSpec struct {
	// Identity is the workload's platform identity as the onboarding endpoint
	// verified it, as opposed to what the workload reported about itself.
	Identity WorkloadIdentity `json:"identity"`
	// Registration holds what the workload's agent reported when it registered.
	Registration Registration `json:"registration"`
	// WorkloadGroup is the snapshot of the WorkloadGroup taken when the workload
	// joined; the workload keeps this configuration until it onboards again.
	WorkloadGroup WorkloadGroupSnapshot `json:"workloadGroup"`
}

// WorkloadIdentity is a verified platform identity. Exactly one member is set.
// +kubebuilder:validation:XValidation:rule="(has(self.aws) ? 1 : 0) + (has(self.jwt) ? 1 : 0) + (has(self.gcp) ? 1 : 0) + (has(self.azure) ? 1 : 0) + (has(self.ecs) ? 1 : 0) == 1",message="exactly one of aws, jwt, gcp, azure or ecs must be set"
type WorkloadIdentity struct {
	// AWS is the identity of an AWS compute resource.
	// +optional
	AWS *AWSIdentity `json:"aws,omitempty"`
	// JWT is the identity of a host that presented a JWT from a trusted issuer.
	// +optional
	JWT *JWTIdentity `json:"jwt,omitempty"`
	// GCP is the identity of a Google Compute Engine instance.
	// +optional
	GCP *GCPIdentity `json:"gcp,omitempty"`
	// Azure is the identity of an Azure virtual machine.
	// +optional
	Azure *AzureIdentity `json:"azure,omitempty"`
	// ECS is the identity of an AWS ECS task.
	// +optional
	ECS *ECSIdentity `json:"ecs,omitempty"`
}

// AzureIdentity is an Azure virtual machine verified from the access token
// of its system-assigned managed identity, signed by Microsoft Entra ID.
// Names are in lower case (Azure compares them without case).
type AzureIdentity struct {
	// TenantID is the Entra ID tenant of the VM's managed identity.
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
	TenantID string `json:"tenantId"`
	// SubscriptionID is the VM's subscription.
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
	SubscriptionID string `json:"subscriptionId"`
	// ResourceGroup is the VM's resource group.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=90
	ResourceGroup string `json:"resourceGroup"`
	// VMName is the VM's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	VMName string `json:"vmName"`
	// PrincipalID is the object ID of the VM's system-assigned managed
	// identity: a VM created again under the same name has another one.
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
	PrincipalID string `json:"principalId"`
	// Location is the VM's Azure region (e.g. westeurope), as Azure
	// Resource Manager reports it; set only when VMConfirmed.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-z0-9]{1,64}$`
	Location string `json:"location,omitempty"`
	// VMID is the VM's unique ID (properties.vmId), as Azure Resource
	// Manager reports it; set only when VMConfirmed.
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`
	VMID string `json:"vmId,omitempty"`
	// VMConfirmed says Azure Resource Manager confirmed the VM (the
	// endpoint's identity.azure.vmCheck): it exists, provisioned, with
	// PrincipalID as its system-assigned identity, in Location, and the
	// private address of its primary network interface is the address the
	// identity proves.
	// +optional
	VMConfirmed bool `json:"vmConfirmed,omitempty"`
}

// ECSIdentity is an AWS ECS task verified from a signed
// sts:GetCallerIdentity request made with its task role's credentials (the
// role session ECS names after the task ID) and, when TaskConfirmed, the ECS
// API's DescribeTasks.
type ECSIdentity struct {
	// Partition is the AWS partition, e.g. aws.
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=32
	Partition string `json:"partition"`
	// Account is the 12-digit AWS account ID of the task role.
	// +kubebuilder:validation:Pattern=`^[0-9]{12}$`
	Account string `json:"account"`
	// Region is the task's region, e.g. us-east-2.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=32
	Region string `json:"region"`
	// Zone is the task's availability zone, e.g. us-east-2b.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=48
	Zone string `json:"zone"`
	// Cluster is the name of the task's cluster.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	Cluster string `json:"cluster"`
	// TaskARN is the task's ARN.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	TaskARN string `json:"taskArn"`
	// TaskID is the task's ID, the last part of its ARN and the name of its
	// task role session.
	// +kubebuilder:validation:Pattern=`^[0-9a-zA-Z_-]{1,64}$`
	TaskID string `json:"taskId"`
	// TaskRole is the name of the task's IAM role, proven by STS.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	TaskRole string `json:"taskRole"`
	// Family and Revision name the task's task definition.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	Family string `json:"family,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=16
	Revision string `json:"revision,omitempty"`
	// TaskConfirmed says the ECS API (DescribeTasks) confirmed the task:
	// it is RUNNING in Cluster with TaskRole, in Zone, with the ENI address
	// the agent claimed. When false, Region, Zone, Cluster, Family and
	// Revision are what the agent claimed, consistent with the task ARN and
	// the role session but not confirmed.
	// +optional
	TaskConfirmed bool `json:"taskConfirmed,omitempty"`
}

// AWSIdentity is an AWS identity verified from the EC2 instance identity
// document's signature (and an STS proof when IAMRole is set).
type AWSIdentity struct {
	// Partition is the AWS partition, e.g. aws, aws-cn or aws-us-gov.
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=32
	Partition string `json:"partition"`
	// Account is the 12-digit AWS account ID.
	// +kubebuilder:validation:Pattern=`^[0-9]{12}$`
	Account string `json:"account"`
	// Region is the AWS region, e.g. us-east-2.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=32
	Region string `json:"region"`
	// Zone is the availability zone, e.g. us-east-2b.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=48
	Zone string `json:"zone"`
	// EC2 is set for EC2 instances.
	// +optional
	EC2 *EC2Identity `json:"ec2,omitempty"`
}

// EC2Identity identifies an EC2 instance.
type EC2Identity struct {
	// InstanceID is the EC2 instance ID, e.g. i-1234567890abcdef0.
	// +kubebuilder:validation:Pattern=`^i-[0-9a-f]{8,17}$`
	InstanceID string `json:"instanceId"`
	// IAMRole is the name of the instance's IAM role; set only when the agent
	// proved it with a signed sts:GetCallerIdentity request.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	IAMRole string `json:"iamRole,omitempty"`
}

// GCPIdentity is a Compute Engine instance verified from its instance
// identity token, signed by Google.
type GCPIdentity struct {
	// ProjectID is the instance's project, e.g. my-project.
	// +kubebuilder:validation:Pattern=`^[a-z][-a-z0-9]{4,28}[a-z0-9]$`
	ProjectID string `json:"projectId"`
	// ProjectNumber is the project's number.
	// +kubebuilder:validation:Pattern=`^[0-9]{1,20}$`
	ProjectNumber string `json:"projectNumber"`
	// Zone is the instance's zone, e.g. us-central1-a.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Zone string `json:"zone"`
	// InstanceID is the instance's numeric ID.
	// +kubebuilder:validation:Pattern=`^[0-9]{1,20}$`
	InstanceID string `json:"instanceId"`
	// InstanceName is the instance's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	InstanceName string `json:"instanceName"`
	// ServiceAccount is the email of the instance's service account.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=254
	ServiceAccount string `json:"serviceAccount"`
	// InstanceConfirmed says the Compute API (compute.instances.get)
	// confirmed the instance (identity.gce.instanceCheck): it exists under
	// InstanceName with InstanceID and is RUNNING, and the internal address
	// of its primary network interface is the registration's proven VPC
	// address. When false the identity proves no address.
	// +optional
	InstanceConfirmed bool `json:"instanceConfirmed,omitempty"`
}

// JWTIdentity is the identity of a host that presented a valid JWT.
type JWTIdentity struct {
	// Issuer is the token's issuer (iss).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	Issuer string `json:"issuer"`
	// ShortName is the issuer's short name from the endpoint configuration,
	// used in the registration's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	ShortName string `json:"shortName"`
	// Subject is the token's subject (sub).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Subject string `json:"subject"`
	// Attributes are the claims the endpoint configuration extracts from the
	// token, by attribute name.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Attributes map[string]string `json:"attributes,omitempty"`
}

// Registration is what the workload's agent reported when it registered.
type Registration struct {
	// Agent describes the onboarding agent.
	// +optional
	Agent AgentInfo `json:"agent,omitempty"`
	// Host describes the host the workload runs on.
	Host HostInfo `json:"host"`
	// Settings are the workload's onboarding settings.
	// +optional
	Settings Settings `json:"settings,omitempty"`
	// Sidecar describes the workload's sidecar.
	// +optional
	Sidecar SidecarInfo `json:"sidecar,omitempty"`
	// Workload describes the workload itself.
	// +optional
	Workload WorkloadInfo `json:"workload,omitempty"`
}

// AgentInfo describes the onboarding agent.
type AgentInfo struct {
	// Version is the agent's version, e.g. v1.4.0.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Version string `json:"version,omitempty"`
}

// HostInfo describes the host the workload runs on.
type HostInfo struct {
	// Addresses are the host's addresses; the first of the type named by
	// settings.connectedOver is the workload's address in the mesh.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	Addresses []HostAddress `json:"addresses"`
}

// HostAddress is one address of a host.
type HostAddress struct {
	// IP is an IPv4 or IPv6 address.
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IPv4 or IPv6 address"
	IP string `json:"ip"`
	// Type says how the address can be reached.
	Type AddressType `json:"type"`
}

// Settings are the workload's onboarding settings.
type Settings struct {
	// ConnectedOver is the type of address the workload is reached over.
	// +optional
	ConnectedOver AddressType `json:"connectedOver,omitempty"`
}

// SidecarInfo describes the workload's sidecar.
type SidecarInfo struct {
	// Istio describes the Istio sidecar.
	// +optional
	Istio IstioSidecarInfo `json:"istio,omitempty"`
}

// IstioSidecarInfo describes the Istio sidecar.
type IstioSidecarInfo struct {
	// Version is the Istio sidecar's version.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Version string `json:"version,omitempty"`
}

// WorkloadInfo describes the workload.
type WorkloadInfo struct {
	// Labels are the workload's own labels, added to the WorkloadGroup
	// template's labels on its WorkloadEntry.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Labels map[string]string `json:"labels,omitempty"`
}

// WorkloadGroupSnapshot is a WorkloadGroup as it was when the workload joined.
type WorkloadGroupSnapshot struct {
	// Name is the WorkloadGroup's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// UID is the WorkloadGroup's UID.
	// +optional
	UID types.UID `json:"uid,omitempty"`
	// Generation is the WorkloadGroup's metadata.generation.
	// +optional
	Generation int64 `json:"generation,omitempty"`
	// Spec is the WorkloadGroup's spec (networking.istio.io WorkloadGroup:
	// metadata, template, probe), kept verbatim.
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Type=object
	Spec runtime.RawExtension `json:"spec"`
}

// WorkloadAutoRegistrationStatus is the observed state of a workload.
type WorkloadAutoRegistrationStatus struct {
	// ObservedGeneration is the metadata.generation this status was written for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: AgentConnected, Healthy, WorkloadGroupOutOfDate, Fenced.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Connection is the state of the workload's connection to the endpoint.
	// +optional
	Connection *ConnectionStatus `json:"connection,omitempty"`
	// Agent is what the workload's onboarding agent reported on its last
	// Register: its version and its last failed onboarding attempt. It is
	// shown to operators and used for no decision.
	// +optional
	Agent *AgentStatus `json:"agent,omitempty"`
}

// AgentStatus is what a workload's onboarding agent reported about itself.
type AgentStatus struct {
	// Version is the agent's version, e.g. v1.4.0.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Version string `json:"version,omitempty"`
	// LastError is the agent's last failed onboarding attempt before it
	// registered; unset when it reported none.
	// +optional
	LastError *AgentError `json:"lastError,omitempty"`
	// ReportedAt is when the endpoint stored what the agent reports now: the
	// Register at which the version or the last error last changed.
	// +optional
	ReportedAt *metav1.Time `json:"reportedAt,omitempty"`
}

// AgentError is a failed onboarding attempt as the agent reported it.
type AgentError struct {
	// Reason is PlatformCredential, BootstrapWrite, or the endpoint's gRPC
	// code such as PermissionDenied.
	// +kubebuilder:validation:Pattern=`^[A-Za-z][A-Za-z0-9]{0,63}$`
	Reason string `json:"reason"`
	// Message says what went wrong, as the agent saw it.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Message string `json:"message,omitempty"`
}

// ConnectionStatus is the state of a workload's connection. The timestamps
// live here, not in an endpoint's memory, so that grace-period removal
// survives endpoint restarts.
type ConnectionStatus struct {
	// Replica is the onboarding endpoint replica that holds (or last held) the
	// workload's ADS stream.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Replica string `json:"replica,omitempty"`
	// ConnectedAt is when the current (or last) connection was established.
	// +optional
	ConnectedAt *metav1.Time `json:"connectedAt,omitempty"`
	// DisconnectedAt is when the last connection closed; unset while connected.
	// +optional
	DisconnectedAt *metav1.Time `json:"disconnectedAt,omitempty"`
}

// +kubebuilder:object:root=true

// WorkloadAutoRegistrationList is a list of WorkloadAutoRegistrations.
type WorkloadAutoRegistrationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WorkloadAutoRegistration `json:"items"`
}
