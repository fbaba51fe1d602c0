// Package config holds the onboarding endpoint's configuration file: a
// versioned YAML document that mirrors spec.meshExpansion.onboarding of the
// control-plane configuration (endpoint hosts and TLS secret, token
// expiration, local repository) plus Embark's own settings. Load reads,
// defaults and validates it; a bad file fails with the field named.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/limits"
)

// APIVersion and Kind identify the configuration file.
const (
	APIVersion = "config.onboarding.tetrate.io/v1alpha1"
	Kind       = "OnboardingEndpointConfiguration"
)

// DefaultNeverConnectedAfter is registration.neverConnectedAfter's default.
const DefaultNeverConnectedAfter = time.Minute

// DefaultOutOfTrafficAfter is registration.outOfTrafficAfter's default
// (capped at registration.gracePeriod): Istio's own auto-registration
// removes a disconnected workload's entry after its clean-up grace of 10s.
const DefaultOutOfTrafficAfter = 10 * time.Second

// Defaults.
const (
	DefaultListenAddress     = ":15443"
	DefaultXDSListenAddress  = ":15012"
	DefaultMetricsAddress    = ":15014"
	DefaultRepositoryAddress = ":8443"
	DefaultTokenExpiration   = time.Hour
	DefaultGracePeriod       = 5 * time.Minute
	DefaultPropagationDelay  = 5 * time.Second
	DefaultHealthDamping     = 10 * time.Second
	DefaultNamespace         = "istio-system"
	DefaultSigningKeySecret  = "onboarding-token-signing-key"
	DefaultClusterID         = "Kubernetes"
	DefaultTrustDomain       = "cluster.local"
	DefaultRepositoryDir     = "/var/lib/onboarding-endpoint/repository"
	DefaultRootNamespace     = "istio-system"
	DefaultXDSDebounce       = 100 * time.Millisecond
	minXDSDebounce           = time.Millisecond
	maxXDSDebounce           = 10 * time.Second
	minTokenExpiration       = time.Minute
	maxTokenExpiration       = 24 * time.Hour
	minGracePeriod           = time.Second
	DefaultMetadataValidity  = 7 * 24 * time.Hour
	minMetadataValidity      = time.Hour
	maxMetadataValidity      = 365 * 24 * time.Hour
)

const (
	// DefaultMaxCertificateValidity is istiod.maxCertificateValidity's
	// default.
	DefaultMaxCertificateValidity = 24 * time.Hour
	// minCertificateValidity and maxCertificateValidity bound
	// istiod.maxCertificateValidity: the API server's shortest token
	// lifetime, and the CA relay's bound (xds/ca.MaxValidity).
	minCertificateValidity = 10 * time.Minute
	maxCertificateValidity = 90 * 24 * time.Hour
)

// Configuration is the onboarding endpoint's configuration file.
type Configuration struct {
	metav1.TypeMeta `json:",inline"`
	// Endpoint is where agents reach the endpoint (meshExpansion.onboarding.endpoint).
	Endpoint Endpoint `json:"endpoint"`
	// TokenIssuer configures the onboarding token (meshExpansion.onboarding.tokenIssuer).
	TokenIssuer TokenIssuer `json:"tokenIssuer,omitempty"`
	// LocalRepository, when set (even to {}), serves the DEB/RPM packages of
	// the agent and sidecar (meshExpansion.onboarding.localRepository).
	LocalRepository *LocalRepository `json:"localRepository,omitempty"`
	// Namespace of the endpoint's own Secrets and Lease. Default istio-system.
	Namespace string `json:"namespace,omitempty"`
	// WorkloadNamespaces are the namespaces whose WorkloadGroups this
	// endpoint onboards: its informers watch only these namespaces, and the
	// install grants its namespaced rights (Secrets, service-account tokens,
	// registrations, WorkloadEntries, ...) there only, with one RoleBinding
	// per namespace (docs/security.md, "Least privilege"). A request for a
	// WorkloadGroup elsewhere is refused FAILED_PRECONDITION naming the
	// namespace. Empty: every namespace, which needs the namespaced rights
	// bound cluster-wide (a ClusterRoleBinding); the shipped manifests set
	// the list.
	WorkloadNamespaces []string `json:"workloadNamespaces,omitempty"`
	// Mesh describes the mesh the workloads join.
	Mesh Mesh `json:"mesh,omitempty"`
	// Identity configures how platform identities are verified.
	Identity Identity `json:"identity,omitempty"`
	// Registration configures the lifecycle of registrations.
	Registration Registration `json:"registration,omitempty"`
	// Listen addresses.
	Listen Listen `json:"listen,omitempty"`
	// XDS configures what the xDS server serves.
	XDS XDS `json:"xds,omitempty"`
	// Istiod is the istiod Embark runs beside. Empty address: no istiod
	// (standalone; no certificate service for VMs).
	Istiod Istiod `json:"istiod,omitempty"`
	// Limits bound what clients can make each server hold
	// (docs/onboarding-endpoint.md, "Limits"). Every zero field means its
	// default.
	Limits Limits `json:"limits,omitempty"`
}

// Limits are the limits of the endpoint's three client-facing servers.
type Limits struct {
	// Onboarding API (gRPC).
	Onboarding limits.Options `json:"onboarding,omitempty"`
	// XDS server (gRPC); firstRequestTimeout applies here only.
	XDS limits.Options `json:"xds,omitempty"`
	// Repository: the local repository (HTTP); httpWriteTimeout and
	// httpReadHeaderTimeout apply here only.
	Repository limits.Options `json:"repository,omitempty"`
}

// Istiod is how the endpoint reaches istiod's secure gRPC port, whose
// certificate service (istio.v1.auth.IstioCertificateService) it relays to
// VMs on its own xDS address. Fields are added here for what else the
// endpoint takes from istiod.
type Istiod struct {
	// Address of istiod's secure gRPC port, host:port, e.g.
	// istiod.istio-system.svc:15012. Empty: no istiod (standalone).
	Address string `json:"address,omitempty"`
	// ServerName is the DNS name istiod's serving certificate is verified
	// against. Default: the host of Address.
	ServerName string `json:"serverName,omitempty"`
	// RootCertFile is a PEM file of istiod's root certificates (the
	// istio-ca-root-cert ConfigMap's root-cert.pem mounted as a file), read
	// again when it changes. Required with Address.
	RootCertFile string `json:"rootCertFile,omitempty"`
	// RelayXDS chooses istiod mode: every VM sidecar's discovery requests
	// are relayed to istiod on a stream authenticated with the sidecar's own
	// token, so VMs get istiod's whole configuration (AuthorizationPolicy,
	// VirtualService, DestinationRule, ...); Embark keeps authentication,
	// liveness and health. false: standalone mode, Embark translates the
	// configuration itself. Default: true when Address is set; requires
	// Address.
	RelayXDS *bool `json:"relayXDS,omitempty"`
	// Revision is the Istio control-plane revision of this istiod (its
	// istio.io/rev), e.g. canary; empty or "default" for none. Registrations
	// and their WorkloadEntries record it as the annotation
	// onboarding.tetrate.io/istio-revision. The entries are never labelled
	// istio.io/rev: istiod takes an entry labelled with a revision only when
	// it is its own, and a VM's entry is mesh data the istiod of every
	// revision must see, like a pod's endpoints.
	Revision string `json:"revision,omitempty"`
	// Revisions are the istiods of other Istio revisions this Embark serves
	// beside the one above (the default revision): a canary istiod during
	// a revision upgrade. Each workload is served by the revision Istio
	// would inject one of its pods with (its namespace's istio-injection
	// and istio.io/rev labels, else its WorkloadGroup's istio.io/rev, else
	// the default); its ADS stream is relayed to that revision's istiod and
	// its certificate requests to that istiod's CA, and it moves, without
	// its stream to Embark closing, when those labels change
	// (docs/istiod.md, "Several revisions"). Default: none.
	Revisions []IstiodRevision `json:"revisions,omitempty"`
	// MaxCertificateValidity caps the validity of the workload certificates
	// relayed from istiod's CA: a VM is certified for at most this and at
	// most its sidecar token's remaining lifetime, whatever it asks for
	// (docs/security.md, "Revocation bound"). Default 24h; between 10m and
	// 2160h (90 days).
	MaxCertificateValidity *metav1.Duration `json:"maxCertificateValidity,omitempty"`
	// CertificateRelay bounds the certificate requests one replica relays
	// to istiod's CA. Unset: the defaults. A pointer, so that a
	// configuration written without it (e.g. for an earlier release, whose
	// strict parser refuses unknown fields) does not carry it.
	CertificateRelay *CertificateRelay `json:"certificateRelay,omitempty"`
}

// CertificateRelay is istiod.certificateRelay: the budget of the CA relay
// on one replica. Requests over it fail with RESOURCE_EXHAUSTED and
// pilot-agent retries with back-off. A scale-out of N VMs needs N
// certificates: at the default 50/s, 500 VMs wait up to 10 s for theirs
// (docs/capacity.md); istiod's own signing rate is the other bound.
type CertificateRelay struct {
	// RequestsPerSecond and Burst: the token bucket of authenticated
	// requests. Defaults 50/s, burst 100; 0 takes the default.
	RequestsPerSecond float64 `json:"requestsPerSecond,omitempty"`
	Burst             int     `json:"burst,omitempty"`
	// MaxInFlight bounds the requests waiting for istiod at once. Default
	// 64; at most 4096.
	MaxInFlight int `json:"maxInFlight,omitempty"`
}

// maxRelayInFlight bounds istiod.certificateRelay.maxInFlight: each request
// waiting holds a goroutine and a CSR in memory.
const maxRelayInFlight = 4096

// IstiodRevision is one more istiod revision (Istiod.Revisions).
type IstiodRevision struct {
	// Name is the revision, as namespaces and WorkloadGroups name it in
	// istio.io/rev (istiod's REVISION), e.g. canary or 1-25-0. Required; a
	// DNS-1123 label, not "default" nor the default revision's name.
	Name string `json:"name"`
	// Address of this istiod's secure gRPC port, host:port, e.g.
	// istiod-canary.istio-system.svc:15012. Required.
	Address string `json:"address"`
	// ServerName its serving certificate is verified against. Default: the
	// host of Address.
	ServerName string `json:"serverName,omitempty"`
	// RootCertFile is a PEM file of its root certificates, read again when
	// it changes. Default: istiod.rootCertFile (revisions of one mesh share
	// its CA).
	RootCertFile string `json:"rootCertFile,omitempty"`
}

// Enabled reports whether an istiod is configured.
func (i Istiod) Enabled() bool { return i.Address != "" }

// Relays reports whether the endpoint runs in istiod mode (see RelayXDS).
func (i Istiod) Relays() bool { return i.Enabled() && (i.RelayXDS == nil || *i.RelayXDS) }

// XDS configures the configuration served over xDS.
type XDS struct {
	// Debounce is how long Sidecars, Services, EndpointSlices,
	// ServiceEntries and WorkloadEntries must be quiet before affected
	// proxies are recomputed (a batch waits at most 10 times as long).
	// Default 100ms; between 1ms and 10s.
	Debounce *metav1.Duration `json:"debounce,omitempty"`
}

// Endpoint is meshExpansion.onboarding.endpoint.
type Endpoint struct {
	// Hosts are the endpoint's DNS names. Required. The first is the
	// audience of onboarding tokens and STS proofs.
	Hosts []string `json:"hosts"`
	// SecretName is the Kubernetes TLS Secret (in Namespace) holding the
	// endpoint's serving certificate. Required unless CertFile/KeyFile are set.
	SecretName string `json:"secretName,omitempty"`
	// CertFile and KeyFile are a PEM serving certificate and key, reloaded when
	// they change (controller-runtime's certwatcher: file events, and a poll
	// every 10s); an alternative to SecretName.
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
	// Plaintext serves without TLS. Only for tests: the onboarding, xDS and
	// repository listen addresses must then be loopback addresses
	// (127.0.0.0/8, ::1 or localhost), or the configuration is refused.
	Plaintext bool `json:"plaintext,omitempty"`
	// DetailedDenialSources are CIDRs of callers told why onboarding was
	// denied: the closest OnboardingPolicy rules (their accounts, roles,
	// zones, subjects) or a WorkloadGroup that does not exist. Any other
	// caller gets PERMISSION_DENIED "not authorized to onboard (request id
	// <id>)", the same for every denial and for a missing WorkloadGroup;
	// the explanation is in the endpoint's log line carrying that request
	// ID, in the OnboardingDenied Event on the WorkloadGroup and in
	// embark_onboarding_denials_total. The endpoint is reachable by any AWS
	// account and any holder of a trusted issuer's token, so details go
	// only to networks an operator trusts, e.g. an admin subnet; the
	// sources are the connections' peers (a load balancer that rewrites
	// sources makes them its own). Default: none.
	DetailedDenialSources []string `json:"detailedDenialSources,omitempty"`
}

// TokenIssuer is meshExpansion.onboarding.tokenIssuer.
type TokenIssuer struct {
	JWT JWTTokenIssuer `json:"jwt,omitempty"`
}

// JWTTokenIssuer configures the onboarding JWT.
type JWTTokenIssuer struct {
	// Expiration is the token lifetime. Default 1h; between 1m and 24h.
	Expiration *metav1.Duration `json:"expiration,omitempty"`
	// SigningKeySecret is the Secret (in Namespace) with the signing keys;
	// created when missing. Default onboarding-token-signing-key.
	SigningKeySecret string `json:"signingKeySecret,omitempty"`
}

// LocalRepository is meshExpansion.onboarding.localRepository.
type LocalRepository struct {
	// Directory mirroring the URL tree below /install/ (deb/amd64/onboarding-agent.deb,
	// istio-sidecar/<revision>/rpm/arm64/istio-sidecar.rpm, ...); served on
	// listen.repository. Default /var/lib/onboarding-endpoint/repository.
	Directory string `json:"directory,omitempty"`
	// ExtraDirectories are more directories in the same layout, looked up
	// after Directory in order: a path is served from the first directory
	// that has it (a package of Directory is never replaced by one of
	// these), and the apt and yum metadata list the packages of all of
	// them. E.g. Istio's istio-sidecar packages from a volume beside the
	// agent's packages of the image. Each must exist at start. Default
	// none.
	ExtraDirectories []string `json:"extraDirectories,omitempty"`
	// SigningKeyFile is an armored OpenPGP private key (one key, no
	// passphrase; in the cluster, a Secret mounted as a file) that signs
	// the apt metadata (dists/<suite>/InRelease, Release.gpg) and the yum
	// metadata (repodata/repomd.xml.asc). Default: none, and then only the
	// package files are served, no apt or yum metadata (never unsigned).
	// Read at start: restart the endpoint after rotating it.
	SigningKeyFile string `json:"signingKeyFile,omitempty"`
	// PublicKeyFiles are armored OpenPGP public keys published at
	// /install/repository.asc beside the signing key's own: the next key
	// before a rotation, the previous one after it. Default none.
	PublicKeyFiles []string `json:"publicKeyFiles,omitempty"`
	// MetadataValidity is how long signed apt metadata is valid: each
	// Release carries Valid-Until = Date + this, after which apt refuses
	// it (an old signed snapshot replayed to a VM stops working), and the
	// endpoint signs fresh metadata once half of it has passed. VMs that
	// cannot reach the endpoint for longer cannot apt-get update from
	// cached lists. Default 168h (7 days); between 1h and 8760h.
	MetadataValidity *metav1.Duration `json:"metadataValidity,omitempty"`
}

// Mesh describes the mesh.
type Mesh struct {
	// ClusterID of this cluster. Default Kubernetes.
	ClusterID string `json:"clusterID,omitempty"`
	// TrustDomain of the mesh. Default cluster.local.
	TrustDomain string `json:"trustDomain,omitempty"`
	// DiscoveryAddress is the xDS address sidecars connect to, host:port.
	// Default: the first endpoint host with the xDS port.
	DiscoveryAddress string `json:"discoveryAddress,omitempty"`
	// RootNamespace is Istio's config root namespace: its selector-less
	// Sidecar is the mesh-wide default. Default istio-system.
	RootNamespace string `json:"rootNamespace,omitempty"`
	// RootCertFile is a PEM file of the root certificates a VM's sidecar
	// verifies the discovery address (and its mesh peers) with: the CA of
	// the endpoint's serving certificate, or Istio's root (the
	// istio-ca-root-cert ConfigMap mounted as a file). It is sent in every
	// registration's bootstrap and written on the VM as root-cert.pem; it is
	// read again for each registration, so a rotated file is served at
	// once. Empty sends no roots (the VM must be given them otherwise).
	RootCertFile string `json:"rootCertFile,omitempty"`
	// Network is the mesh's network topology when VMs are on networks of
	// their own (docs/multi-network.md): each registration's network is
	// checked against it and the result written as its NetworkTopology
	// condition. Unset: one network, nothing checked but a WorkloadGroup
	// whose network label contradicts its network.
	Network *MeshNetwork `json:"network,omitempty"`
}

// MeshNetwork is the mesh's networks as istiod sees them.
type MeshNetwork struct {
	// Pods is the pods' network: the topology.istio.io/network label of
	// istiod's namespace, and of vmgateway (the chart's vmgateway.network).
	// Required.
	Pods string `json:"pods"`
	// PodCIDRs are the pods' address ranges: a workload on another network
	// with an address in one is reported. Default: none.
	PodCIDRs []string `json:"podCIDRs,omitempty"`
	// Gateways are the other networks that have a gateway istiod knows of
	// (meshNetworks); a workload on a network neither the pods' nor listed
	// here is reported. Default: none.
	Gateways []string `json:"gateways,omitempty"`
}

// Identity configures platform identity verification.
type Identity struct {
	// AWS verification.
	AWS AWSIdentity `json:"aws,omitempty"`
	// JWT lists the OIDC issuers trusted for on-prem hosts.
	JWT []JWTIssuer `json:"jwt,omitempty"`
	// GCE, when set (even to {}), accepts Google Compute Engine instance
	// identity tokens (docs/platforms/gce.md). Default: unset, GCE
	// credentials are refused.
	GCE *GCEIdentity `json:"gce,omitempty"`
	// Azure, when set, accepts Azure VM managed identity tokens
	// (docs/platforms/azure.md). Default: unset, Azure credentials are
	// refused.
	Azure *AzureIdentity `json:"azure,omitempty"`
	// ECS, when set (even to {}), accepts AWS ECS task credentials
	// (docs/platforms/ecs.md): STS proofs of task role sessions, checked
	// with identity.aws's STS settings. Default: unset, ECS credentials are
	// refused.
	ECS *ECSIdentity `json:"ecs,omitempty"`
}

// AzureIdentity configures the verification of Azure VM managed identity
// tokens. The issuers are pinned to each tenant's
// https://sts.windows.net/<tenant>/ and
// https://login.microsoftonline.com/<tenant>/v2.0.
type AzureIdentity struct {
	// Tenants are the Entra ID tenant IDs whose VMs may onboard. Required.
	Tenants []string `json:"tenants"`
	// Audiences the token must carry one of: the resource the agents ask
	// the Instance Metadata Service for (host.azure.resource), the
	// application ID URI of the endpoint's Entra application. Default: the
	// endpoint's first host.
	Audiences []string `json:"audiences,omitempty"`
	// JWKSURL is where a tenant's signing keys are fetched (https), with
	// {tenant} for the tenant ID. Default:
	// https://login.microsoftonline.com/{tenant}/discovery/v2.0/keys.
	JWKSURL string `json:"jwksURL,omitempty"`
	// CAFile (PEM) holds the roots the keys are fetched with. Default: the
	// system roots.
	CAFile string `json:"caFile,omitempty"`
	// MaxTokenLifetime refuses tokens valid for longer (exp minus iat).
	// Default 25h (Entra ID gives managed identity tokens about 24h).
	MaxTokenLifetime *metav1.Duration `json:"maxTokenLifetime,omitempty"`
	// VMCheck, when set (even to {}), confirms every VM with Azure
	// Resource Manager: the VM exists, provisioned (Succeeded), with the
	// token's principal as its system-assigned identity; its location, VM
	// ID and the private address of its primary network interface are then
	// part of the identity. Only a confirmed VM proves its address, and
	// only confirmed VMs match azure rules naming locations. Default: unset.
	VMCheck *AzureVMCheck `json:"vmCheck,omitempty"`
}

// AzureVMCheck configures the Azure Resource Manager check. The endpoint's
// own Entra ID token for Resource Manager comes from AKS workload identity
// (AZURE_FEDERATED_TOKEN_FILE, AZURE_CLIENT_ID, AZURE_TENANT_ID) when set,
// else from the managed identity of its VM or node through IMDS.
type AzureVMCheck struct {
	// ARMEndpoint replaces https://management.azure.com (tests, sovereign
	// clouds).
	ARMEndpoint string `json:"armEndpoint,omitempty"`
	// IMDSEndpoint replaces http://169.254.169.254, where the endpoint's
	// managed identity token is fetched without workload identity (tests).
	IMDSEndpoint string `json:"imdsEndpoint,omitempty"`
	// APICallBudget bounds the Resource Manager calls (two per VM) and
	// says how long a VM's description is reused (default 30s).
	APICallBudget `json:",inline"`
}

// validate checks a VM check configuration (nil: not configured).
func (v *AzureVMCheck) validate(p *field.Path) field.ErrorList {
	if v == nil {
		return nil
	}
	errs := v.APICallBudget.validate(p)
	errs = append(errs, validateAPIEndpoint(p.Child("armEndpoint"), v.ARMEndpoint, true)...)
	return append(errs, validateAPIEndpoint(p.Child("imdsEndpoint"), v.IMDSEndpoint, true)...)
}

// APICallBudget is what the configuration of every optional cloud API
// check says about its calls; its fields stand in the check's own YAML
// object (ratePerSecond, burst, cacheTTL).
type APICallBudget struct {
	// RatePerSecond and Burst bound the check's API calls (shared by all
	// callers; over it Authorize answers UNAVAILABLE, retried). Default
	// 5/s, burst 10.
	RatePerSecond float64 `json:"ratePerSecond,omitempty"`
	Burst         int     `json:"burst,omitempty"`
	// CacheTTL is how long an answer of the API is reused. Default: the
	// check's (30s; instanceProfileCheck 1m).
	CacheTTL *metav1.Duration `json:"cacheTTL,omitempty"`
}

// validate checks the rate, burst and cache time to live of the check at
// p: none may be negative (zero: the default).
func (b APICallBudget) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if b.RatePerSecond < 0 {
		errs = append(errs, field.Invalid(p.Child("ratePerSecond"), b.RatePerSecond, "must not be negative"))
	}
	if b.Burst < 0 {
		errs = append(errs, field.Invalid(p.Child("burst"), b.Burst, "must not be negative"))
	}
	if b.CacheTTL != nil && b.CacheTTL.Duration < 0 {
		errs = append(errs, field.Invalid(p.Child("cacheTTL"), b.CacheTTL.Duration.String(), "must not be negative"))
	}
	return errs
}

// validateAPIEndpoint checks a cloud API's replacement base URL ("" is the
// default): http(s) with a host and, when noQuery, without query or
// fragment.
func validateAPIEndpoint(p *field.Path, val string, noQuery bool) field.ErrorList {
	if val == "" {
		return nil
	}
	u, err := url.Parse(val)
	switch {
	case err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "":
	case noQuery && (u.RawQuery != "" || u.Fragment != ""):
	default:
		return nil
	}
	msg := "must be an http(s) URL"
	if noQuery {
		msg += " without query"
	}
	return field.ErrorList{field.Invalid(p, val, msg)}
}

// GCEIdentity configures the verification of Compute Engine instance
// identity tokens. The issuer is pinned to https://accounts.google.com.
type GCEIdentity struct {
	// Audiences the token must carry one of: the audience the agents ask
	// the metadata server for. Default: the endpoint's first host.
	Audiences []string `json:"audiences,omitempty"`
	// JWKSURL is where Google's signing keys are fetched (https). Default:
	// https://www.googleapis.com/oauth2/v3/certs.
	JWKSURL string `json:"jwksURL,omitempty"`
	// CAFile (PEM) holds the roots the JWKS is fetched with. Default: the
	// system roots.
	CAFile string `json:"caFile,omitempty"`
	// MaxTokenLifetime refuses tokens valid for longer (exp minus iat).
	// Default 1h, the lifetime Google gives them.
	MaxTokenLifetime *metav1.Duration `json:"maxTokenLifetime,omitempty"`
	// InstanceCheck, when set (even to {}), confirms every instance with
	// the Compute API (compute.instances.get): it exists under the token's
	// name with the token's numeric ID and is RUNNING; the internal address
	// of its primary network interface (nic0) is then proven, as an EC2
	// document's privateIp is. Default: unset, no address is proven.
	InstanceCheck *GCEInstanceCheck `json:"instanceCheck,omitempty"`
}

// GCEInstanceCheck configures the Compute API check. The endpoint's Google
// credentials are the Application Default Credentials (GKE workload
// identity, the node's service account, GOOGLE_APPLICATION_CREDENTIALS)
// unless CredentialsFile is set; they need compute.instances.get on every
// onboarding project (docs/platforms/gce.md).
type GCEInstanceCheck struct {
	// CredentialsFile is a service account key file (JSON) to ask the
	// Compute API with. Default: the Application Default Credentials.
	CredentialsFile string `json:"credentialsFile,omitempty"`
	// APICallBudget bounds the Compute API calls and says how long an
	// instance's description is reused (default 30s).
	APICallBudget `json:",inline"`
	// ComputeEndpoint replaces https://compute.googleapis.com (tests,
	// Private Service Connect endpoints).
	ComputeEndpoint string `json:"computeEndpoint,omitempty"`
}

// AWSIdentity configures AWS verification.
type AWSIdentity struct {
	// CertificatesDir replaces the embedded AWS region certificates with the
	// <region>.pem files of this directory.
	CertificatesDir string `json:"certificatesDir,omitempty"`
	// STSEndpoint overrides the STS endpoint (tests, private endpoints).
	STSEndpoint string `json:"stsEndpoint,omitempty"`
	// InstanceProfileCheck, when set (even to {}), confirms every IAM role
	// an STS proof shows with EC2 and IAM: the instance's currently
	// associated instance profile must carry that role
	// (docs/security.md, "What the STS proof proves").
	InstanceProfileCheck *InstanceProfileCheck `json:"instanceProfileCheck,omitempty"`
}

// InstanceProfileCheck configures the EC2 instance profile check. The
// endpoint's AWS credentials come from the SDK's default chain (IRSA, EKS
// Pod Identity, environment).
type InstanceProfileCheck struct {
	// RoleARN is assumed in each instance's account to ask EC2 and IAM;
	// "{account}" and "{partition}" are replaced, e.g.
	// arn:{partition}:iam::{account}:role/embark-instance-profile-reader.
	// It needs only ec2:DescribeIamInstanceProfileAssociations and
	// iam:GetInstanceProfile. Empty: the endpoint's own credentials, for
	// instances of its own account.
	RoleARN string `json:"roleARN,omitempty"`
	// APICallBudget bounds the EC2 and IAM calls and says how long an
	// instance's profile and a profile's roles are reused (default 1m).
	APICallBudget `json:",inline"`
	// EC2Endpoint, IAMEndpoint and STSEndpoint replace the AWS endpoints
	// (tests, private endpoints).
	EC2Endpoint string `json:"ec2Endpoint,omitempty"`
	IAMEndpoint string `json:"iamEndpoint,omitempty"`
	STSEndpoint string `json:"stsEndpoint,omitempty"`
}

// JWTIssuer is one trusted OIDC issuer.
type JWTIssuer struct {
	Issuer    string `json:"issuer"`
	ShortName string `json:"shortName"`
	// Audiences the token must carry one of. Default: the endpoint's first host.
	Audiences []string `json:"audiences,omitempty"`
	// JWKS inline (a JSON Web Key Set) or JWKSURL (https).
	JWKS    string `json:"jwks,omitempty"`
	JWKSURL string `json:"jwksURL,omitempty"`
	// With neither jwks nor jwksURL the key set is found by OIDC discovery
	// (<issuer>/.well-known/openid-configuration); issuer must be https.
	// CAFile (PEM) holds the roots the issuer's discovery document and JWKS
	// are fetched with. Default: the system roots.
	CAFile string `json:"caFile,omitempty"`
	// MaxTokenLifetime refuses tokens valid for longer (exp minus iat).
	// Default 1h.
	MaxTokenLifetime *metav1.Duration `json:"maxTokenLifetime,omitempty"`
	// SubjectPrefix is required at the start of sub and removed from it
	// (e.g. "system:serviceaccount:onprem:" for a Kubernetes issuer).
	SubjectPrefix string `json:"subjectPrefix,omitempty"`
	// AllowTokensWithoutJTI accepts tokens without a jti (which cannot be
	// refused as replays). Default false.
	AllowTokensWithoutJTI bool `json:"allowTokensWithoutJTI,omitempty"`
	// Attributes maps attribute names to dotted claim paths.
	Attributes map[string]string `json:"attributes,omitempty"`
}

// Registration configures the lifecycle of registrations.
type Registration struct {
	// GracePeriod after a workload's last stream closed before its
	// registration is removed. Default 5m.
	GracePeriod *metav1.Duration `json:"gracePeriod,omitempty"`
	// NeverConnectedAfter is how long after registering a workload whose
	// sidecar has not opened an ADS stream is shown AgentConnected=False,
	// reason AgentNeverConnected (it is still removed at the end of the grace
	// period from its registration). Zero or unset: 1m.
	NeverConnectedAfter *metav1.Duration `json:"neverConnectedAfter,omitempty"`
	// OutOfTrafficAfter is how long after a workload's last stream on a
	// replica closed, with no stream of it since, that replica takes its
	// WorkloadEntry out of traffic (pods stop being sent the workload; the
	// registration lives on for GracePeriod; a reconnect puts it back).
	// A replica that shuts down or dies takes nothing out. At most
	// GracePeriod. Zero or unset: 10s, or GracePeriod when shorter.
	OutOfTrafficAfter *metav1.Duration `json:"outOfTrafficAfter,omitempty"`
	// PropagationDelay the agent waits after unregistering. Default 5s.
	PropagationDelay *metav1.Duration `json:"propagationDelay,omitempty"`
	// WriteQPS and WriteBurst are the write budget of one replica: every
	// API write of every registry component (registrations, WorkloadEntries,
	// Secrets, status) counts against one limiter (registry/write). Zero or
	// unset: 400/1000 (write.DefaultQPS, write.DefaultBurst): sized so that
	// 1,000 simultaneous disconnects (one write each) are stored within 3 s
	// and a reconnect storm of 1,000 (two writes each) within 10 s, while
	// the sustained rate stays well under what one kube-apiserver stores;
	// the API server's Priority and Fairness queues what several replicas
	// send at once. Lower both for a small or shared API server: states are
	// then stored later, never lost. The client-side rate limit of the
	// endpoint's Kubernetes clients follows the budget (three requests per
	// write), so it never throttles below it.
	WriteQPS   float64 `json:"writeQPS,omitempty"`
	WriteBurst int     `json:"writeBurst,omitempty"`
	// SweepRatePerSecond limits grace-period deletions (within the write
	// budget). Zero or unset: 20.
	SweepRatePerSecond float64 `json:"sweepRatePerSecond,omitempty"`
	// HealthDamping is the window of the health flapping rule
	// (docs/health.md): a flip of a workload whose probe changed status less
	// than this before is stored only once it has lasted this long. 0
	// disables damping. Default 10s.
	HealthDamping *metav1.Duration `json:"healthDamping,omitempty"`
	// SweepBurst is how many grace-period deletions may happen at once
	// before SweepRatePerSecond applies. Zero or unset: 1.
	SweepBurst int `json:"sweepBurst,omitempty"`
	// ServiceCIDRs are the cluster's Service ranges (e.g. 10.96.0.0/12): a
	// workload address inside one is refused. Default: none.
	ServiceCIDRs []string `json:"serviceCIDRs,omitempty"`
	// SourceAddressCheck requires a workload address to be the source
	// address of the connection that registers it (docs/security.md).
	// Default: not checked.
	SourceAddressCheck *SourceAddressCheck `json:"sourceAddressCheck,omitempty"`
	// VerifyPerSecond and VerifyBurst limit platform credential
	// verifications (Authorize) per source address. Default 5/20; a
	// negative VerifyPerSecond disables the limit.
	VerifyPerSecond float64 `json:"verifyPerSecond,omitempty"`
	VerifyBurst     int     `json:"verifyBurst,omitempty"`
	// AllowLoopbackAddresses accepts loopback workload addresses. For
	// demos and tests that simulate VMs on 127.0.0.0/8 only; it logs a
	// warning. Default false.
	AllowLoopbackAddresses bool `json:"allowLoopbackAddresses,omitempty"`
}

// SourceAddressCheck configures the check of workload addresses against the
// connection's source address.
type SourceAddressCheck struct {
	// Enabled turns the check on.
	Enabled bool `json:"enabled"`
	// TrustedProxyCIDRs are peers (proxies, load balancers that rewrite
	// the source) whose connections are not checked.
	TrustedProxyCIDRs []string `json:"trustedProxyCIDRs,omitempty"`
}

// validate checks the network names (label values, as Istio's
// topology.istio.io/network) and the CIDRs; a nil n is valid.
func (n *MeshNetwork) validate(p *field.Path) field.ErrorList {
	if n == nil {
		return nil
	}
	var errs field.ErrorList
	if n.Pods == "" {
		errs = append(errs, field.Required(p.Child("pods"), "the pods' network (the topology.istio.io/network label of istiod's namespace)"))
	}
	names := append([]string{n.Pods}, n.Gateways...)
	for i, name := range names {
		path := p.Child("pods")
		if i > 0 {
			path = p.Child("gateways").Index(i - 1)
		}
		if msgs := validation.IsValidLabelValue(name); name != "" && len(msgs) > 0 {
			errs = append(errs, field.Invalid(path, name, msgs[0]))
		}
		if i > 0 && slices.Contains(names[:i], name) {
			errs = append(errs, field.Duplicate(path, name))
		}
	}
	for i, cidr := range n.PodCIDRs {
		if _, err := netip.ParsePrefix(cidr); err != nil {
			errs = append(errs, field.Invalid(p.Child("podCIDRs").Index(i), cidr, "must be a CIDR"))
		}
	}
	return errs
}

// Prefixes parses CIDRs that Validate accepted.
func Prefixes(cidrs []string) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// Listen holds listen addresses.
type Listen struct {
	// Onboarding API (gRPC). Default :15443.
	Onboarding string `json:"onboarding,omitempty"`
	// Repository: the local repository (HTTPS, the endpoint's serving
	// certificate), when localRepository is set. Default :8443.
	Repository string `json:"repository,omitempty"`
	// XDS server. Default :15012.
	XDS string `json:"xds,omitempty"`
	// Metrics and health. Default :15014.
	Metrics string `json:"metrics,omitempty"`
}

// Load reads, defaults and validates the configuration file at path.
func Load(path string) (*Configuration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read configuration: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("configuration %s: %w", path, err)
	}
	return cfg, nil
}

// Parse decodes, defaults and validates a configuration. Unknown fields are
// errors.
func Parse(data []byte) (*Configuration, error) {
	cfg := &Configuration{}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("empty configuration")
	}
	if err := yaml.UnmarshalStrict(data, cfg); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if errs := cfg.validateType(); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	cfg.SetDefaults()
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return cfg, nil
}

func (c *Configuration) validateType() field.ErrorList {
	var errs field.ErrorList
	if c.APIVersion != APIVersion {
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), c.APIVersion, []string{APIVersion}))
	}
	if c.Kind != Kind {
		errs = append(errs, field.NotSupported(field.NewPath("kind"), c.Kind, []string{Kind}))
	}
	return errs
}

// SetDefaults fills every unset field with its default.
func (c *Configuration) SetDefaults() {
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.TokenIssuer.JWT.Expiration == nil {
		c.TokenIssuer.JWT.Expiration = &metav1.Duration{Duration: DefaultTokenExpiration}
	}
	if c.TokenIssuer.JWT.SigningKeySecret == "" {
		c.TokenIssuer.JWT.SigningKeySecret = DefaultSigningKeySecret
	}
	if c.LocalRepository != nil && c.LocalRepository.Directory == "" {
		c.LocalRepository.Directory = DefaultRepositoryDir
	}
	if c.LocalRepository != nil && c.LocalRepository.MetadataValidity == nil {
		c.LocalRepository.MetadataValidity = &metav1.Duration{Duration: DefaultMetadataValidity}
	}
	if c.Mesh.ClusterID == "" {
		c.Mesh.ClusterID = DefaultClusterID
	}
	if c.Mesh.TrustDomain == "" {
		c.Mesh.TrustDomain = DefaultTrustDomain
	}
	if c.Mesh.RootNamespace == "" {
		c.Mesh.RootNamespace = DefaultRootNamespace
	}
	if c.XDS.Debounce == nil {
		c.XDS.Debounce = &metav1.Duration{Duration: DefaultXDSDebounce}
	}
	if c.Listen.Onboarding == "" {
		c.Listen.Onboarding = DefaultListenAddress
	}
	if c.Listen.XDS == "" {
		c.Listen.XDS = DefaultXDSListenAddress
	}
	if c.Listen.Metrics == "" {
		c.Listen.Metrics = DefaultMetricsAddress
	}
	if c.Listen.Repository == "" {
		c.Listen.Repository = DefaultRepositoryAddress
	}
	if c.Mesh.DiscoveryAddress == "" && len(c.Endpoint.Hosts) > 0 {
		_, port, err := net.SplitHostPort(c.Listen.XDS)
		if err == nil {
			c.Mesh.DiscoveryAddress = net.JoinHostPort(c.Endpoint.Hosts[0], port)
		}
	}
	for i := range c.Identity.JWT {
		if len(c.Identity.JWT[i].Audiences) == 0 && len(c.Endpoint.Hosts) > 0 {
			c.Identity.JWT[i].Audiences = []string{c.Endpoint.Hosts[0]}
		}
	}
	if g := c.Identity.GCE; g != nil && len(g.Audiences) == 0 && len(c.Endpoint.Hosts) > 0 {
		g.Audiences = []string{c.Endpoint.Hosts[0]}
	}
	if a := c.Identity.Azure; a != nil && len(a.Audiences) == 0 && len(c.Endpoint.Hosts) > 0 {
		a.Audiences = []string{c.Endpoint.Hosts[0]}
	}
	c.Limits.Onboarding.SetDefaults()
	c.Limits.XDS.SetDefaults()
	c.Limits.Repository.SetDefaults()
	if c.Istiod.MaxCertificateValidity == nil {
		c.Istiod.MaxCertificateValidity = &metav1.Duration{Duration: DefaultMaxCertificateValidity}
	}
	if c.Istiod.Address != "" && c.Istiod.ServerName == "" {
		if host, _, err := net.SplitHostPort(c.Istiod.Address); err == nil {
			c.Istiod.ServerName = host
		}
	}
	r := &c.Registration
	if r.GracePeriod == nil {
		r.GracePeriod = &metav1.Duration{Duration: DefaultGracePeriod}
	}
	if r.NeverConnectedAfter == nil || r.NeverConnectedAfter.Duration == 0 {
		r.NeverConnectedAfter = &metav1.Duration{Duration: DefaultNeverConnectedAfter}
	}
	if r.OutOfTrafficAfter == nil || r.OutOfTrafficAfter.Duration == 0 {
		r.OutOfTrafficAfter = &metav1.Duration{Duration: min(DefaultOutOfTrafficAfter, r.GracePeriod.Duration)}
	}
	if r.PropagationDelay == nil {
		r.PropagationDelay = &metav1.Duration{Duration: DefaultPropagationDelay}
	}
	if r.HealthDamping == nil {
		r.HealthDamping = &metav1.Duration{Duration: DefaultHealthDamping}
	}
	// writeQPS, writeBurst, sweepRatePerSecond and sweepBurst stay zero
	// when unset: their defaults are defined once, by the registry
	// (write.DefaultQPS, write.DefaultBurst, lifecycle.DefaultRemovalQPS,
	// removal burst 1), where zero means "default".
}

// Validate checks a defaulted configuration.
func (c *Configuration) Validate() field.ErrorList {
	var errs field.ErrorList
	ep := field.NewPath("endpoint")
	if len(c.Endpoint.Hosts) == 0 {
		errs = append(errs, field.Required(ep.Child("hosts"), "the endpoint's DNS name(s)"))
	}
	for i, h := range c.Endpoint.Hosts {
		if net.ParseIP(h) != nil {
			continue
		}
		for _, msg := range validation.IsDNS1123Subdomain(h) {
			errs = append(errs, field.Invalid(ep.Child("hosts").Index(i), h, msg))
		}
	}
	files := c.Endpoint.CertFile != "" || c.Endpoint.KeyFile != ""
	switch {
	case c.Endpoint.Plaintext && (files || c.Endpoint.SecretName != ""):
		errs = append(errs, field.Invalid(ep.Child("plaintext"), true, "plaintext excludes secretName and certFile/keyFile"))
	case c.Endpoint.Plaintext:
	case files && c.Endpoint.SecretName != "":
		errs = append(errs, field.Invalid(ep.Child("secretName"), c.Endpoint.SecretName, "set either secretName or certFile/keyFile"))
	case files && (c.Endpoint.CertFile == "" || c.Endpoint.KeyFile == ""):
		errs = append(errs, field.Required(ep.Child("keyFile"), "certFile and keyFile go together"))
	case !files && c.Endpoint.SecretName == "":
		errs = append(errs, field.Required(ep.Child("secretName"), "the TLS Secret of the endpoint (or certFile/keyFile)"))
	case c.Endpoint.SecretName != "":
		for _, msg := range validation.IsDNS1123Subdomain(c.Endpoint.SecretName) {
			errs = append(errs, field.Invalid(ep.Child("secretName"), c.Endpoint.SecretName, msg))
		}
	}
	for i, cidr := range c.Endpoint.DetailedDenialSources {
		if _, err := netip.ParsePrefix(cidr); err != nil {
			errs = append(errs, field.Invalid(ep.Child("detailedDenialSources").Index(i), cidr, "must be a CIDR"))
		}
	}
	exp := c.TokenIssuer.JWT.Expiration.Duration
	if exp < minTokenExpiration || exp > maxTokenExpiration {
		errs = append(errs, field.Invalid(field.NewPath("tokenIssuer", "jwt", "expiration"), exp.String(), fmt.Sprintf("must be between %s and %s", minTokenExpiration, maxTokenExpiration)))
	}
	for _, msg := range validation.IsDNS1123Label(c.Namespace) {
		errs = append(errs, field.Invalid(field.NewPath("namespace"), c.Namespace, msg))
	}
	wns := map[string]bool{}
	for i, ns := range c.WorkloadNamespaces {
		p := field.NewPath("workloadNamespaces").Index(i)
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, field.Invalid(p, ns, msg))
		}
		if wns[ns] {
			errs = append(errs, field.Duplicate(p, ns))
		}
		wns[ns] = true
	}
	if c.LocalRepository != nil && c.LocalRepository.Directory == "" {
		errs = append(errs, field.Required(field.NewPath("localRepository", "directory"), ""))
	}
	if r := c.LocalRepository; r != nil {
		dirs := map[string]bool{path.Clean(r.Directory): true}
		for i, d := range r.ExtraDirectories {
			p := field.NewPath("localRepository", "extraDirectories").Index(i)
			switch {
			case d == "":
				errs = append(errs, field.Required(p, ""))
			case dirs[path.Clean(d)]:
				errs = append(errs, field.Duplicate(p, d))
			}
			dirs[path.Clean(d)] = true
		}
	}
	if r := c.LocalRepository; r != nil && r.MetadataValidity != nil {
		if d := r.MetadataValidity.Duration; d < minMetadataValidity || d > maxMetadataValidity {
			errs = append(errs, field.Invalid(field.NewPath("localRepository", "metadataValidity"), d.String(), fmt.Sprintf("must be between %s and %s", minMetadataValidity, maxMetadataValidity)))
		}
	}
	if c.LocalRepository != nil && c.LocalRepository.SigningKeyFile == "" && len(c.LocalRepository.PublicKeyFiles) > 0 {
		errs = append(errs, field.Required(field.NewPath("localRepository", "signingKeyFile"), "publicKeyFiles are published only beside a signing key"))
	}
	if _, _, err := net.SplitHostPort(c.Mesh.DiscoveryAddress); err != nil {
		errs = append(errs, field.Invalid(field.NewPath("mesh", "discoveryAddress"), c.Mesh.DiscoveryAddress, "must be host:port"))
	}
	errs = append(errs, c.Mesh.Network.validate(field.NewPath("mesh", "network"))...)
	seen := map[string]bool{}
	for i, j := range c.Identity.JWT {
		p := field.NewPath("identity", "jwt").Index(i)
		if j.Issuer == "" {
			errs = append(errs, field.Required(p.Child("issuer"), ""))
		}
		if msgs := validation.IsDNS1123Label(j.ShortName); len(msgs) > 0 {
			errs = append(errs, field.Invalid(p.Child("shortName"), j.ShortName, msgs[0]))
		}
		if seen[j.ShortName] {
			errs = append(errs, field.Duplicate(p.Child("shortName"), j.ShortName))
		}
		seen[j.ShortName] = true
		if j.JWKS != "" && j.JWKSURL != "" {
			errs = append(errs, field.Invalid(p.Child("jwks"), j.JWKS, "set at most one of jwks and jwksURL (neither: OIDC discovery)"))
		}
		if j.MaxTokenLifetime != nil && j.MaxTokenLifetime.Duration < 0 {
			errs = append(errs, field.Invalid(p.Child("maxTokenLifetime"), j.MaxTokenLifetime.Duration.String(), "must not be negative"))
		}
	}
	errs = append(errs, c.Identity.GCE.validate(field.NewPath("identity", "gce"))...)
	errs = append(errs, c.Identity.Azure.validate(field.NewPath("identity", "azure"))...)
	errs = append(errs, c.Identity.ECS.validate(field.NewPath("identity", "ecs"))...)
	if pc := c.Identity.AWS.InstanceProfileCheck; pc != nil {
		errs = append(errs, pc.APICallBudget.validate(field.NewPath("identity", "aws", "instanceProfileCheck"))...)
	}
	r := field.NewPath("registration")
	if c.Registration.GracePeriod.Duration < minGracePeriod {
		errs = append(errs, field.Invalid(r.Child("gracePeriod"), c.Registration.GracePeriod.Duration.String(), "must be at least 1s"))
	}
	if c.Registration.NeverConnectedAfter.Duration < 0 {
		errs = append(errs, field.Invalid(r.Child("neverConnectedAfter"), c.Registration.NeverConnectedAfter.Duration.String(), "must not be negative"))
	}
	switch d := c.Registration.OutOfTrafficAfter.Duration; {
	case d < 0:
		errs = append(errs, field.Invalid(r.Child("outOfTrafficAfter"), d.String(), "must not be negative"))
	case d > c.Registration.GracePeriod.Duration:
		errs = append(errs, field.Invalid(r.Child("outOfTrafficAfter"), d.String(),
			"must not exceed registration.gracePeriod ("+c.Registration.GracePeriod.Duration.String()+"): the registration is removed by then"))
	}
	if c.Registration.PropagationDelay.Duration < 0 {
		errs = append(errs, field.Invalid(r.Child("propagationDelay"), c.Registration.PropagationDelay.Duration.String(), "must not be negative"))
	}
	if c.Registration.HealthDamping.Duration < 0 {
		errs = append(errs, field.Invalid(r.Child("healthDamping"), c.Registration.HealthDamping.Duration.String(), "must not be negative"))
	}
	for i, cidr := range c.Registration.ServiceCIDRs {
		if _, err := netip.ParsePrefix(cidr); err != nil {
			errs = append(errs, field.Invalid(r.Child("serviceCIDRs").Index(i), cidr, "must be a CIDR"))
		}
	}
	if sc := c.Registration.SourceAddressCheck; sc != nil {
		for i, cidr := range sc.TrustedProxyCIDRs {
			if _, err := netip.ParsePrefix(cidr); err != nil {
				errs = append(errs, field.Invalid(r.Child("sourceAddressCheck", "trustedProxyCIDRs").Index(i), cidr, "must be a CIDR"))
			}
		}
	}
	if c.Registration.VerifyBurst < 0 {
		errs = append(errs, field.Invalid(r.Child("verifyBurst"), c.Registration.VerifyBurst, "must not be negative"))
	}
	if c.Registration.WriteQPS < 0 {
		errs = append(errs, field.Invalid(r.Child("writeQPS"), c.Registration.WriteQPS, "must be positive"))
	}
	if c.Registration.WriteBurst < 0 {
		errs = append(errs, field.Invalid(r.Child("writeBurst"), c.Registration.WriteBurst, "must be positive"))
	}
	if c.Registration.SweepRatePerSecond < 0 {
		errs = append(errs, field.Invalid(r.Child("sweepRatePerSecond"), c.Registration.SweepRatePerSecond, "must be positive"))
	}
	if d := c.XDS.Debounce.Duration; d < minXDSDebounce || d > maxXDSDebounce {
		errs = append(errs, field.Invalid(field.NewPath("xds", "debounce"), d.String(), fmt.Sprintf("must be between %s and %s", minXDSDebounce, maxXDSDebounce)))
	}
	if d := c.Istiod.MaxCertificateValidity.Duration; d < minCertificateValidity || d > maxCertificateValidity {
		errs = append(errs, field.Invalid(field.NewPath("istiod", "maxCertificateValidity"), d.String(), fmt.Sprintf("must be between %s and %s", minCertificateValidity, maxCertificateValidity)))
	}
	errs = append(errs, validateCertificateRelay(c.Istiod.CertificateRelay, field.NewPath("istiod", "certificateRelay"))...)
	for _, msg := range validation.IsDNS1123Label(c.Mesh.RootNamespace) {
		errs = append(errs, field.Invalid(field.NewPath("mesh", "rootNamespace"), c.Mesh.RootNamespace, msg))
	}
	if c.Registration.SweepBurst < 0 {
		errs = append(errs, field.Invalid(r.Child("sweepBurst"), c.Registration.SweepBurst, "must be positive"))
	}
	if c.Istiod.Enabled() {
		ip := field.NewPath("istiod")
		if _, _, err := net.SplitHostPort(c.Istiod.Address); err != nil {
			errs = append(errs, field.Invalid(ip.Child("address"), c.Istiod.Address, "must be host:port"))
		}
		if c.Istiod.RootCertFile == "" {
			errs = append(errs, field.Required(ip.Child("rootCertFile"), "istiod's root certificates (root-cert.pem of the istio-ca-root-cert ConfigMap)"))
		}
		for _, msg := range validation.IsValidLabelValue(c.Istiod.Revision) {
			errs = append(errs, field.Invalid(ip.Child("revision"), c.Istiod.Revision, msg))
		}
		errs = append(errs, c.Istiod.validateRevisions(ip.Child("revisions"))...)
	} else if c.Istiod.ServerName != "" || c.Istiod.RootCertFile != "" || c.Istiod.Revision != "" || (c.Istiod.RelayXDS != nil && *c.Istiod.RelayXDS) || len(c.Istiod.Revisions) > 0 {
		errs = append(errs, field.Required(field.NewPath("istiod", "address"), "serverName, rootCertFile, revision, revisions and relayXDS need istiod's address"))
	}
	for _, l := range []struct{ name, addr string }{{"onboarding", c.Listen.Onboarding}, {"xds", c.Listen.XDS}, {"metrics", c.Listen.Metrics}, {"repository", c.Listen.Repository}} {
		host, _, err := net.SplitHostPort(l.addr)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(field.NewPath("listen", l.name), l.addr, "must be [host]:port"))
		case c.Endpoint.Plaintext && l.name != "metrics" && (l.name != "repository" || c.LocalRepository != nil) && !isLoopback(host):
			errs = append(errs, field.Invalid(field.NewPath("listen", l.name), l.addr,
				"endpoint.plaintext serves without TLS and is allowed only on loopback listen addresses (127.0.0.1, ::1 or localhost); configure TLS (endpoint.secretName or certFile/keyFile) to listen elsewhere"))
		}
	}
	lp := field.NewPath("limits")
	for _, l := range []struct {
		name string
		o    *limits.Options
	}{{"onboarding", &c.Limits.Onboarding}, {"xds", &c.Limits.XDS}, {"repository", &c.Limits.Repository}} {
		if name, msg, ok := l.o.Validate(); !ok {
			errs = append(errs, field.Invalid(lp.Child(l.name, name), "", msg))
		}
	}
	return errs
}

// validateRevisions checks istiod.revisions: each a distinct DNS-1123
// label other than the default revision's, with a host:port address.
func (i Istiod) validateRevisions(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := map[string]bool{}
	for n, r := range i.Revisions {
		rp := p.Index(n)
		for _, msg := range validation.IsDNS1123Label(r.Name) {
			errs = append(errs, field.Invalid(rp.Child("name"), r.Name, msg))
		}
		switch {
		case r.Name == "default" || r.Name == i.Revision:
			errs = append(errs, field.Invalid(rp.Child("name"), r.Name, "is the default revision's name (istiod.revision, or \"default\"): the default revision is istiod.address"))
		case seen[r.Name]:
			errs = append(errs, field.Duplicate(rp.Child("name"), r.Name))
		}
		seen[r.Name] = true
		if _, _, err := net.SplitHostPort(r.Address); err != nil {
			errs = append(errs, field.Invalid(rp.Child("address"), r.Address, "must be host:port"))
		}
	}
	return errs
}

// RootCertFileOf is the root certificate file of revision r: its own, else
// the default revision's.
func (i Istiod) RootCertFileOf(r IstiodRevision) string {
	if r.RootCertFile != "" {
		return r.RootCertFile
	}
	return i.RootCertFile
}

// isLoopback tells whether a listen host accepts loopback connections only.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// Audience is the audience of onboarding tokens and STS proofs: this
// onboarding plane's first host name.
func (c *Configuration) Audience() string { return c.Endpoint.Hosts[0] }

// validate checks a GCE identity configuration (nil: not configured).
func (g *GCEIdentity) validate(p *field.Path) field.ErrorList {
	if g == nil {
		return nil
	}
	var errs field.ErrorList
	if len(g.Audiences) == 0 {
		errs = append(errs, field.Required(p.Child("audiences"), "set audiences or endpoint.hosts"))
	}
	for i, a := range g.Audiences {
		if a == "" {
			errs = append(errs, field.Invalid(p.Child("audiences").Index(i), a, "must not be empty"))
		}
	}
	if g.JWKSURL != "" {
		if u, err := url.Parse(g.JWKSURL); err != nil || u.Scheme != "https" || u.Host == "" {
			errs = append(errs, field.Invalid(p.Child("jwksURL"), g.JWKSURL, "must be an https URL"))
		}
	}
	if g.MaxTokenLifetime != nil && g.MaxTokenLifetime.Duration < 0 {
		errs = append(errs, field.Invalid(p.Child("maxTokenLifetime"), g.MaxTokenLifetime.Duration.String(), "must not be negative"))
	}
	return append(errs, g.InstanceCheck.validate(p.Child("instanceCheck"))...)
}

// validate checks a Compute API check configuration (nil: not configured).
func (ic *GCEInstanceCheck) validate(p *field.Path) field.ErrorList {
	if ic == nil {
		return nil
	}
	errs := ic.APICallBudget.validate(p)
	return append(errs, validateAPIEndpoint(p.Child("computeEndpoint"), ic.ComputeEndpoint, false)...)
}

// azureTenantRE is a tenant ID: a GUID.
var azureTenantRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// validate checks an Azure identity configuration (nil: not configured).
func (a *AzureIdentity) validate(p *field.Path) field.ErrorList {
	if a == nil {
		return nil
	}
	var errs field.ErrorList
	if len(a.Tenants) == 0 {
		errs = append(errs, field.Required(p.Child("tenants"), "list the tenant IDs whose VMs may onboard"))
	}
	seen := map[string]bool{}
	for i, t := range a.Tenants {
		switch {
		case !azureTenantRE.MatchString(t):
			errs = append(errs, field.Invalid(p.Child("tenants").Index(i), t, "must be a tenant ID (a GUID)"))
		case seen[strings.ToLower(t)]:
			errs = append(errs, field.Duplicate(p.Child("tenants").Index(i), t))
		}
		seen[strings.ToLower(t)] = true
	}
	if len(a.Audiences) == 0 {
		errs = append(errs, field.Required(p.Child("audiences"), "set audiences or endpoint.hosts"))
	}
	for i, au := range a.Audiences {
		if au == "" {
			errs = append(errs, field.Invalid(p.Child("audiences").Index(i), au, "must not be empty"))
		}
	}
	if a.JWKSURL != "" {
		if u, err := url.Parse(a.JWKSURL); err != nil || u.Scheme != "https" || u.Host == "" {
			errs = append(errs, field.Invalid(p.Child("jwksURL"), a.JWKSURL, "must be an https URL"))
		}
	}
	if a.MaxTokenLifetime != nil && a.MaxTokenLifetime.Duration < 0 {
		errs = append(errs, field.Invalid(p.Child("maxTokenLifetime"), a.MaxTokenLifetime.Duration.String(), "must not be negative"))
	}
	errs = append(errs, a.VMCheck.validate(p.Child("vmCheck"))...)
	return errs
}

// ECSIdentity configures the verification of ECS task credentials.
type ECSIdentity struct {
	// TaskCheck, when set (even to {}), confirms every task with the ECS
	// API (DescribeTasks): RUNNING, in the claimed cluster and zone, with
	// the proven task role and the claimed ENI address. Only a confirmed
	// task proves its address, and only confirmed tasks match ecs rules
	// naming regions, zones or clusters. Default: unset.
	TaskCheck *ECSTaskCheck `json:"taskCheck,omitempty"`
}

// ECSTaskCheck configures the ECS API check. The endpoint's AWS credentials
// come from the SDK's default chain (IRSA, EKS Pod Identity, environment).
type ECSTaskCheck struct {
	// RoleARN is assumed in each task's account to ask ECS; "{account}"
	// and "{partition}" are replaced, e.g.
	// arn:{partition}:iam::{account}:role/embark-ecs-task-reader. It needs
	// only ecs:DescribeTasks and ecs:DescribeTaskDefinition. Empty: the
	// endpoint's own credentials, for tasks of its own account.
	RoleARN string `json:"roleARN,omitempty"`
	// APICallBudget bounds the ECS calls and says how long a task's
	// description is reused (default 30s).
	APICallBudget `json:",inline"`
	// ECSEndpoint and STSEndpoint replace the AWS endpoints (tests, private
	// endpoints).
	ECSEndpoint string `json:"ecsEndpoint,omitempty"`
	STSEndpoint string `json:"stsEndpoint,omitempty"`
}

// validate checks an ECS identity configuration (nil: not configured).
func (e *ECSIdentity) validate(p *field.Path) field.ErrorList {
	if e == nil || e.TaskCheck == nil {
		return nil
	}
	tc, p := e.TaskCheck, p.Child("taskCheck")
	errs := tc.APICallBudget.validate(p)
	errs = append(errs, validateAPIEndpoint(p.Child("ecsEndpoint"), tc.ECSEndpoint, false)...)
	return append(errs, validateAPIEndpoint(p.Child("stsEndpoint"), tc.STSEndpoint, false)...)
}

// validateCertificateRelay refuses a negative or non-finite budget and an
// in-flight bound past maxRelayInFlight.
func validateCertificateRelay(rp *CertificateRelay, p *field.Path) field.ErrorList {
	if rp == nil {
		return nil
	}
	r := *rp
	var errs field.ErrorList
	if r.RequestsPerSecond < 0 || math.IsNaN(r.RequestsPerSecond) || math.IsInf(r.RequestsPerSecond, 0) {
		errs = append(errs, field.Invalid(p.Child("requestsPerSecond"), r.RequestsPerSecond, "must be a positive number"))
	}
	if r.Burst < 0 {
		errs = append(errs, field.Invalid(p.Child("burst"), r.Burst, "must be positive"))
	}
	if r.MaxInFlight < 0 || r.MaxInFlight > maxRelayInFlight {
		errs = append(errs, field.Invalid(p.Child("maxInFlight"), r.MaxInFlight, fmt.Sprintf("must be between 0 (the default) and %d", maxRelayInFlight)))
	}
	return errs
}
