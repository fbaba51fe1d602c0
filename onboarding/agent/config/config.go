// Package config holds the onboarding agent's two configuration files, both
// versioned YAML documents under /etc/onboarding-agent/: the agent
// configuration (how the host proves what it is, where the sidecar's files
// go, how the sidecar is restarted) and the onboarding configuration (which
// endpoint to onboard through and which WorkloadGroup to join). Load reads,
// defaults and validates them; unknown fields are errors, and every error
// names the field at fault.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/embark-mesh/embark/onboarding/agent/hostdns"
)

// APIVersion and the kinds of the two files.
const (
	APIVersion               = "config.agent.onboarding.tetrate.io/v1alpha1"
	AgentKind                = "AgentConfiguration"
	OnboardingKind           = "OnboardingConfiguration"
	DefaultAgentConfigFile   = "/etc/onboarding-agent/agent.config.yaml"
	DefaultOnboardingFile    = "/etc/onboarding-agent/onboarding.config.yaml"
	DefaultEndpointPort      = 15443
	DefaultClusterEnvFile    = "/var/lib/istio/envoy/cluster.env"
	DefaultMeshConfigFile    = "/etc/istio/config/mesh"
	DefaultRootCertFile      = "/etc/certs/embark-root-cert.pem"
	DefaultTokenFile         = "/var/run/secrets/tokens/istio-token"
	DefaultCredentialTimeout = 10 * time.Second
	// DefaultSidecarUnit is the systemd unit of Istio's istio-sidecar
	// package (tools/packaging/common/istio.service upstream).
	DefaultSidecarUnit = "istio.service"
	// DefaultStagingDir is where the agent stages the sidecar's files for
	// the root-run onboarding-agent-sidecar.service to install.
	DefaultStagingDir = "/var/lib/onboarding-agent/sidecar"
)

// Platforms the agent knows.
const (
	PlatformAuto  = "auto"
	PlatformAWS   = "aws"
	PlatformJWT   = "jwt"
	PlatformGCE   = "gce"
	PlatformAzure = "azure"
	PlatformECS   = "ecs"
)

// AgentConfiguration is /etc/onboarding-agent/agent.config.yaml.
type AgentConfiguration struct {
	metav1.TypeMeta `json:",inline"`
	// Host says how the host proves its identity.
	Host Host `json:"host,omitempty"`
	// Sidecar says where its bootstrap goes and how it is restarted.
	Sidecar Sidecar `json:"sidecar,omitempty"`
	// Metrics configures the agent's Prometheus metrics endpoint.
	Metrics AgentMetrics `json:"metrics,omitempty"`
	// StateDirectory is where the agent keeps its session across restarts
	// (session.json, mode 0600: its onboarding token and session key), an
	// absolute path writable by the agent alone. Default: the directory
	// systemd's StateDirectory= gives the agent ($STATE_DIRECTORY,
	// /var/lib/onboarding-agent for the packaged unit), which the
	// onboarding-agent command reads; without either, the session is kept
	// in memory only and a restarted agent onboards as a new session.
	StateDirectory string `json:"stateDirectory,omitempty"`
}

// DefaultSidecarReadyURL is pilot-agent's readiness endpoint (its status
// port), which answers 200 once the sidecar's Envoy is ready.
const DefaultSidecarReadyURL = "http://127.0.0.1:15020/healthz/ready"

// AgentMetrics configures the agent's metrics endpoint, which serves
// /metrics on a loopback address (for a node-local Prometheus agent or
// exporter): whether the host is onboarded, the last onboarding error's
// reason, the tokens' expiry, whether the sidecar is ready, the agent's
// version.
type AgentMetrics struct {
	// Address is the loopback host:port to serve /metrics on, e.g.
	// 127.0.0.1:15099; it must be a loopback address (127.0.0.0/8, ::1 or
	// localhost). Default: empty, no metrics endpoint.
	Address string `json:"address,omitempty"`
	// SidecarReadyURL is asked at each scrape whether the sidecar is ready
	// (an http:// URL answering 200 when it is). Default
	// DefaultSidecarReadyURL, pilot-agent's status port.
	SidecarReadyURL string `json:"sidecarReadyURL,omitempty"`
}

// Host configures platform detection and credentials.
type Host struct {
	// Platform is auto (default: ecs when ECS_CONTAINER_METADATA_URI_V4 is
	// set, else AWS when IMDS answers, else gce when the Compute Engine
	// metadata server answers, else azure when the Azure Instance Metadata
	// Service answers, else jwt when a JWT source is configured), aws, ecs,
	// gce, azure or jwt. The ecs platform signs its STS proof for
	// aws.stsEndpoint when set.
	Platform string `json:"platform,omitempty"`
	// AWS configures the EC2 credential.
	AWS AWSPlatform `json:"aws,omitempty"`
	// JWT configures the on-prem credential.
	JWT JWTPlatform `json:"jwt,omitempty"`
	// GCE configures the Compute Engine credential.
	GCE GCEPlatform `json:"gce,omitempty"`
	// Azure configures the Azure VM credential.
	Azure AzurePlatform `json:"azure,omitempty"`
}

// AzurePlatform configures the Azure VM credential: the access token of
// the VM's system-assigned managed identity.
type AzurePlatform struct {
	// IMDSEndpoint overrides the Instance Metadata Service's address
	// (default http://169.254.169.254).
	IMDSEndpoint string `json:"imdsEndpoint,omitempty"`
	// Resource is the resource the token is requested for: the application
	// ID URI of the onboarding endpoint's Entra application, one of the
	// endpoint's identity.azure.audiences. Default: the onboarding
	// endpoint's host name.
	Resource string `json:"resource,omitempty"`
}

// GCEPlatform configures the Compute Engine credential: the instance
// identity token of the instance's default service account.
type GCEPlatform struct {
	// MetadataEndpoint overrides the metadata server's address (default
	// http://metadata.google.internal).
	MetadataEndpoint string `json:"metadataEndpoint,omitempty"`
}

// AWSPlatform configures the EC2 credential.
type AWSPlatform struct {
	// IMDSEndpoint overrides the instance metadata service address
	// (default: the SDK's, http://169.254.169.254).
	IMDSEndpoint string `json:"imdsEndpoint,omitempty"`
	// STSEndpoint overrides the STS endpoint the signed
	// sts:GetCallerIdentity request is addressed to (default: the region's).
	STSEndpoint string `json:"stsEndpoint,omitempty"`
	// DisableSTSProof leaves the signed STS request out (default false:
	// it is sent whenever the instance has a role).
	DisableSTSProof bool `json:"disableSTSProof,omitempty"`
}

// JWTPlatform configures the on-prem JWT credential: one of TokenFile or
// Command.
type JWTPlatform struct {
	// TokenFile holds the JWT; it is reread for every authorization.
	TokenFile string `json:"tokenFile,omitempty"`
	// Command is a credential plugin: it is run (argv, no shell) for every
	// authorization and prints the JWT on standard output.
	Command []string `json:"command,omitempty"`
	// Timeout of Command. Default 10s.
	Timeout *metav1.Duration `json:"timeout,omitempty"`
}

// Sidecar configures the Istio sidecar.
type Sidecar struct {
	// Istio describes the installed sidecar.
	Istio IstioSidecar `json:"istio,omitempty"`
	// Bootstrap is where the sidecar's files are written.
	Bootstrap BootstrapFiles `json:"bootstrap,omitempty"`
	// Unit is the sidecar's systemd unit, which the root-run
	// onboarding-agent-sidecar.service restarts and stops. Default
	// istio.service (Istio's istio-sidecar package).
	Unit string `json:"unit,omitempty"`
	// CAAddress is the certificate service the sidecar asks for its
	// workload certificate (cluster.env CA_ADDR). Default: unset, and
	// istio-start.sh and pilot-agent use the bootstrap's discovery address
	// (Embark relays istiod's certificate service there).
	CAAddress string `json:"caAddress,omitempty"`
	// StagingDir is where the agent writes cluster.env, the mesh config and
	// the root certificate, and its restart/stop requests, for
	// onboarding-agent-sidecar.service (run as root by the
	// onboarding-agent-sidecar.path unit) to validate, install at the
	// Bootstrap paths and act on. Default /var/lib/onboarding-agent/sidecar.
	// Used only when RestartCommand is empty.
	StagingDir string `json:"stagingDir,omitempty"`
	// RestartCommand and StopCommand, when set (both), replace the staging
	// directory: the agent writes the Bootstrap paths itself and runs these
	// (argv, no shell) to restart the sidecar after a new bootstrap and to
	// stop it at shutdown. Default: unset.
	RestartCommand []string `json:"restartCommand,omitempty"`
	StopCommand    []string `json:"stopCommand,omitempty"`
	// DNS configures pilot-agent's DNS proxy, which answers the mesh's
	// names (Services, ServiceEntry hosts) from istiod's name table.
	DNS SidecarDNS `json:"dns,omitempty"`
}

// DefaultDNSAddress is where pilot-agent's DNS proxy listens by default:
// loopback, an unprivileged port (pilot-agent runs as istio-proxy and
// binds :53 only as root), the address Istio itself defaults to.
const DefaultDNSAddress = "127.0.0.1:15053"

// SidecarDNS configures pilot-agent's DNS proxy (cluster.env
// ISTIO_META_DNS_CAPTURE, DNS_PROXY_ADDR, ISTIO_META_DNS_AUTO_ALLOCATE).
type SidecarDNS struct {
	// Enabled turns the DNS proxy on (ISTIO_META_DNS_CAPTURE=true: the
	// proxy asks istiod for the name table and answers mesh names). No
	// iptables rule captures anything: the host's resolver sends mesh
	// domains to Address (docs/dns.md). Default true.
	Enabled *bool `json:"enabled,omitempty"`
	// Address is the proxy's UDP and TCP listen address (DNS_PROXY_ADDR),
	// a loopback IP and a port other than 53. Default 127.0.0.1:15053.
	Address string `json:"address,omitempty"`
	// AutoAllocate asks istiod for addresses of ServiceEntry hosts that
	// declare none (ISTIO_META_DNS_AUTO_ALLOCATE=true), so that they resolve
	// on the VM. Default false.
	AutoAllocate bool `json:"autoAllocate,omitempty"`
	// Domains are the DNS domains the host's resolver sends to the proxy
	// (route-only: no other name goes there): the cluster's domain and any
	// ServiceEntry host domains. Default [cluster.local].
	Domains []string `json:"domains,omitempty"`
	// Link is the interface the host's resolver (systemd-resolved) reaches
	// the proxy through: a dummy link of the sidecar's own (docs/dns.md).
	Link SidecarDNSLink `json:"link,omitempty"`
}

// SidecarDNSLink names the sidecar's resolver link.
type SidecarDNSLink struct {
	// Name of the interface. Default mesh-dns0.
	Name string `json:"name,omitempty"`
	// Address the interface carries (resolved uses only links with a
	// routable address), one host address. Default 169.254.53.53/32.
	Address string `json:"address,omitempty"`
}

// DefaultDNSDomains are the domains routed to the sidecar by default.
var DefaultDNSDomains = []string{"cluster.local"}

// On reports whether the DNS proxy is enabled (nil: the default, true).
func (d SidecarDNS) On() bool { return d.Enabled == nil || *d.Enabled }

// Direct reports whether the agent writes the bootstrap and runs the
// sidecar commands itself (RestartCommand set) rather than staging them.
func (s *Sidecar) Direct() bool { return len(s.RestartCommand) > 0 }

// IstioSidecar describes the installed Istio sidecar.
type IstioSidecar struct {
	// Revision of the Istio control plane the sidecar belongs to (empty:
	// the default revision).
	Revision string `json:"revision,omitempty"`
	// Version reported in the registration (default: unknown).
	Version string `json:"version,omitempty"`
}

// BootstrapFiles are the files Istio's agent reads on a VM.
type BootstrapFiles struct {
	// ClusterEnv: environment of the sidecar. Default /var/lib/istio/envoy/cluster.env.
	ClusterEnv string `json:"clusterEnv,omitempty"`
	// MeshConfig: mesh config with defaultConfig (discoveryAddress,
	// readinessProbe). Default /etc/istio/config/mesh.
	MeshConfig string `json:"meshConfig,omitempty"`
	// RootCert: PEM roots for the discovery address. Default /etc/certs/embark-root-cert.pem.
	RootCert string `json:"rootCert,omitempty"`
	// Token: the sidecar's token. Default /var/run/secrets/tokens/istio-token.
	Token string `json:"token,omitempty"`
}

// OnboardingConfiguration is /etc/onboarding-agent/onboarding.config.yaml.
type OnboardingConfiguration struct {
	metav1.TypeMeta `json:",inline"`
	// OnboardingEndpoint is where to onboard.
	OnboardingEndpoint OnboardingEndpoint `json:"onboardingEndpoint"`
	// Workload says what to join.
	Workload Workload `json:"workload"`
}

// OnboardingEndpoint locates the onboarding endpoint.
type OnboardingEndpoint struct {
	// Host is the endpoint's DNS name, host[:port]; port default 15443.
	// The host is also the TLS server name and the audience of the STS proof.
	Host string `json:"host"`
	// TLSServerName overrides the TLS server name (default: Host's host).
	TLSServerName string `json:"tlsServerName,omitempty"`
	// CACertificates is a PEM file of roots to trust for the endpoint
	// (default: the system roots).
	CACertificates string `json:"caCertificates,omitempty"`
	// Audience overrides the audience of the STS proof (default: Host's host).
	Audience string `json:"audience,omitempty"`
}

// Workload names the WorkloadGroup and what the workload adds.
type Workload struct {
	// Namespace and Name of the WorkloadGroup. Required.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Labels added to the WorkloadGroup template's.
	Labels map[string]string `json:"labels,omitempty"`
	// Addresses override the detected host addresses.
	Addresses []Address `json:"addresses,omitempty"`
	// ConnectedOver: VPC (default) or INTERNET.
	ConnectedOver string `json:"connectedOver,omitempty"`
}

// Address is one host address.
type Address struct {
	IP   string `json:"ip"`
	Type string `json:"type,omitempty"`
}

// LoadAgent reads, defaults and validates the agent configuration at path.
func LoadAgent(path string) (*AgentConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read agent configuration: %w", err)
	}
	cfg, err := ParseAgent(data)
	if err != nil {
		return nil, fmt.Errorf("agent configuration %s: %w", path, err)
	}
	return cfg, nil
}

// LoadOnboarding reads, defaults and validates the onboarding configuration at path.
func LoadOnboarding(path string) (*OnboardingConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read onboarding configuration: %w", err)
	}
	cfg, err := ParseOnboarding(data)
	if err != nil {
		return nil, fmt.Errorf("onboarding configuration %s: %w", path, err)
	}
	return cfg, nil
}

func decode(data []byte, into any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return errors.New("empty configuration")
	}
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	return nil
}

func checkType(tm metav1.TypeMeta, kind string) field.ErrorList {
	var errs field.ErrorList
	if tm.APIVersion != APIVersion {
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), tm.APIVersion, []string{APIVersion}))
	}
	if tm.Kind != kind {
		errs = append(errs, field.NotSupported(field.NewPath("kind"), tm.Kind, []string{kind}))
	}
	return errs
}

// ParseAgent decodes, defaults and validates an agent configuration.
func ParseAgent(data []byte) (*AgentConfiguration, error) {
	cfg := &AgentConfiguration{}
	if err := decode(data, cfg); err != nil {
		return nil, err
	}
	if errs := checkType(cfg.TypeMeta, AgentKind); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	cfg.SetDefaults()
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return cfg, nil
}

// SetDefaults fills in every default.
func (c *AgentConfiguration) SetDefaults() {
	if c.Metrics.SidecarReadyURL == "" {
		c.Metrics.SidecarReadyURL = DefaultSidecarReadyURL
	}
	if c.Host.Platform == "" {
		c.Host.Platform = PlatformAuto
	}
	if c.Host.JWT.Timeout == nil {
		c.Host.JWT.Timeout = &metav1.Duration{Duration: DefaultCredentialTimeout}
	}
	b := &c.Sidecar.Bootstrap
	for _, d := range []struct {
		f   *string
		def string
	}{{&b.ClusterEnv, DefaultClusterEnvFile}, {&b.MeshConfig, DefaultMeshConfigFile}, {&b.RootCert, DefaultRootCertFile}, {&b.Token, DefaultTokenFile}} {
		if *d.f == "" {
			*d.f = d.def
		}
	}
	if c.Sidecar.Unit == "" {
		c.Sidecar.Unit = DefaultSidecarUnit
	}
	if c.Sidecar.StagingDir == "" {
		c.Sidecar.StagingDir = DefaultStagingDir
	}
	if c.Sidecar.DNS.Address == "" {
		c.Sidecar.DNS.Address = DefaultDNSAddress
	}
	if c.Sidecar.DNS.Link.Name == "" {
		c.Sidecar.DNS.Link.Name = hostdns.DefaultLinkName
	}
	if c.Sidecar.DNS.Link.Address == "" {
		c.Sidecar.DNS.Link.Address = hostdns.DefaultLinkAddress
	}
	if len(c.Sidecar.DNS.Domains) == 0 {
		c.Sidecar.DNS.Domains = append([]string(nil), DefaultDNSDomains...)
	}
}

// Validate checks a defaulted agent configuration.
func (c *AgentConfiguration) Validate() field.ErrorList {
	var errs field.ErrorList
	host := field.NewPath("host")
	switch c.Host.Platform {
	case PlatformAuto, PlatformAWS, PlatformJWT, PlatformGCE, PlatformAzure, PlatformECS:
	default:
		errs = append(errs, field.NotSupported(host.Child("platform"), c.Host.Platform, []string{PlatformAuto, PlatformAWS, PlatformECS, PlatformGCE, PlatformAzure, PlatformJWT}))
	}
	if d := c.StateDirectory; d != "" && !filepath.IsAbs(d) {
		errs = append(errs, field.Invalid(field.NewPath("stateDirectory"), d, "must be an absolute path"))
	}
	if u := c.Host.Azure.IMDSEndpoint; u != "" && !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		errs = append(errs, field.Invalid(host.Child("azure", "imdsEndpoint"), u, "must be an http:// or https:// URL"))
	}
	if u := c.Host.GCE.MetadataEndpoint; u != "" && !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
		errs = append(errs, field.Invalid(host.Child("gce", "metadataEndpoint"), u, "must be an http:// or https:// URL"))
	}
	for _, u := range []struct {
		name, val string
	}{{"imdsEndpoint", c.Host.AWS.IMDSEndpoint}, {"stsEndpoint", c.Host.AWS.STSEndpoint}} {
		if u.val != "" && !strings.HasPrefix(u.val, "http://") && !strings.HasPrefix(u.val, "https://") {
			errs = append(errs, field.Invalid(host.Child("aws", u.name), u.val, "must be an http:// or https:// URL"))
		}
	}
	jwt := host.Child("jwt")
	if c.Host.JWT.TokenFile != "" && len(c.Host.JWT.Command) > 0 {
		errs = append(errs, field.Forbidden(jwt.Child("command"), "set tokenFile or command, not both"))
	}
	if len(c.Host.JWT.Command) > 0 && c.Host.JWT.Command[0] == "" {
		errs = append(errs, field.Invalid(jwt.Child("command").Index(0), "", "must name a program"))
	}
	if c.Host.Platform == PlatformJWT && c.Host.JWT.TokenFile == "" && len(c.Host.JWT.Command) == 0 {
		errs = append(errs, field.Required(jwt, "platform jwt needs tokenFile or command"))
	}
	if c.Host.JWT.Timeout.Duration <= 0 {
		errs = append(errs, field.Invalid(jwt.Child("timeout"), c.Host.JWT.Timeout.Duration.String(), "must be positive"))
	}
	sc := field.NewPath("sidecar")
	if r := c.Sidecar.Istio.Revision; r != "" {
		for _, msg := range validation.IsDNS1123Label(r) {
			errs = append(errs, field.Invalid(sc.Child("istio", "revision"), r, msg))
		}
	}
	b := c.Sidecar.Bootstrap
	seen := map[string]string{}
	for _, f := range []struct{ name, path string }{{"clusterEnv", b.ClusterEnv}, {"meshConfig", b.MeshConfig}, {"rootCert", b.RootCert}, {"token", b.Token}} {
		p := sc.Child("bootstrap", f.name)
		if !strings.HasPrefix(f.path, "/") {
			errs = append(errs, field.Invalid(p, f.path, "must be an absolute path"))
		}
		if other, dup := seen[f.path]; dup {
			errs = append(errs, field.Duplicate(p, f.path+" (also "+other+")"))
		}
		seen[f.path] = f.name
	}
	if !strings.HasPrefix(c.Sidecar.StagingDir, "/") {
		errs = append(errs, field.Invalid(sc.Child("stagingDir"), c.Sidecar.StagingDir, "must be an absolute path"))
	}
	if !unitName.MatchString(c.Sidecar.Unit) {
		errs = append(errs, field.Invalid(sc.Child("unit"), c.Sidecar.Unit, "must be a systemd service name such as istio.service"))
	}
	if a := c.Sidecar.CAAddress; a != "" {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, field.Invalid(sc.Child("caAddress"), a, "must be host:port"))
		}
	}
	errs = append(errs, validateDNSAddress(sc.Child("dns", "address"), c.Sidecar.DNS.Address)...)
	if err := hostdns.ValidLinkName(c.Sidecar.DNS.Link.Name); err != nil {
		errs = append(errs, field.Invalid(sc.Child("dns", "link", "name"), c.Sidecar.DNS.Link.Name, err.Error()))
	}
	if _, err := hostdns.ParseLinkAddress(c.Sidecar.DNS.Link.Address); err != nil {
		errs = append(errs, field.Invalid(sc.Child("dns", "link", "address"), c.Sidecar.DNS.Link.Address, err.Error()))
	}
	for i, d := range c.Sidecar.DNS.Domains {
		for _, msg := range validation.IsDNS1123Subdomain(d) {
			errs = append(errs, field.Invalid(sc.Child("dns", "domains").Index(i), d, msg))
		}
	}
	errs = append(errs, c.Metrics.validate(field.NewPath("metrics"))...)
	if (len(c.Sidecar.RestartCommand) == 0) != (len(c.Sidecar.StopCommand) == 0) {
		errs = append(errs, field.Required(sc.Child("stopCommand"), "set restartCommand and stopCommand together, or neither"))
	}
	for _, cmd := range []struct {
		name string
		argv []string
	}{{"restartCommand", c.Sidecar.RestartCommand}, {"stopCommand", c.Sidecar.StopCommand}} {
		if len(cmd.argv) > 0 && cmd.argv[0] == "" {
			errs = append(errs, field.Invalid(sc.Child(cmd.name).Index(0), "", "must name a program"))
		}
	}
	return errs
}

// validate checks that Address, when set, is a loopback host:port and
// SidecarReadyURL an http:// URL.
func (m *AgentMetrics) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if a := m.Address; a != "" {
		host, port, err := net.SplitHostPort(a)
		switch {
		case err != nil || port == "":
			errs = append(errs, field.Invalid(p.Child("address"), a, "must be host:port"))
		case !isLoopback(host):
			errs = append(errs, field.Invalid(p.Child("address"), a, "must be a loopback address (127.0.0.1, ::1 or localhost): the metrics endpoint has no authentication"))
		}
	}
	if u, err := url.Parse(m.SidecarReadyURL); err != nil || u.Scheme != "http" || u.Host == "" {
		errs = append(errs, field.Invalid(p.Child("sidecarReadyURL"), m.SidecarReadyURL, "must be an http:// URL"))
	}
	return errs
}

// isLoopback reports whether host is localhost or a loopback IP.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ParseOnboarding decodes, defaults and validates an onboarding configuration.
func ParseOnboarding(data []byte) (*OnboardingConfiguration, error) {
	cfg := &OnboardingConfiguration{}
	if err := decode(data, cfg); err != nil {
		return nil, err
	}
	if errs := checkType(cfg.TypeMeta, OnboardingKind); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	cfg.SetDefaults()
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return cfg, nil
}

// SetDefaults fills in every default.
func (c *OnboardingConfiguration) SetDefaults() {
	if c.Workload.ConnectedOver == "" {
		c.Workload.ConnectedOver = "VPC"
	}
	for i := range c.Workload.Addresses {
		if c.Workload.Addresses[i].Type == "" {
			c.Workload.Addresses[i].Type = "VPC"
		}
	}
}

// Validate checks a defaulted onboarding configuration.
func (c *OnboardingConfiguration) Validate() field.ErrorList {
	var errs field.ErrorList
	ep := field.NewPath("onboardingEndpoint")
	if c.OnboardingEndpoint.Host == "" {
		errs = append(errs, field.Required(ep.Child("host"), "the onboarding endpoint's DNS name, host[:port]"))
	} else if _, _, err := SplitHostPort(c.OnboardingEndpoint.Host); err != nil {
		errs = append(errs, field.Invalid(ep.Child("host"), c.OnboardingEndpoint.Host, err.Error()))
	}
	w := field.NewPath("workload")
	if c.Workload.Namespace == "" {
		errs = append(errs, field.Required(w.Child("namespace"), "the WorkloadGroup's namespace"))
	} else {
		for _, msg := range validation.IsDNS1123Label(c.Workload.Namespace) {
			errs = append(errs, field.Invalid(w.Child("namespace"), c.Workload.Namespace, msg))
		}
	}
	if c.Workload.Name == "" {
		errs = append(errs, field.Required(w.Child("name"), "the WorkloadGroup's name"))
	} else {
		for _, msg := range validation.IsDNS1123Subdomain(c.Workload.Name) {
			errs = append(errs, field.Invalid(w.Child("name"), c.Workload.Name, msg))
		}
	}
	for k, v := range c.Workload.Labels {
		p := w.Child("labels").Key(k)
		for _, msg := range validation.IsQualifiedName(k) {
			errs = append(errs, field.Invalid(p, k, msg))
		}
		for _, msg := range validation.IsValidLabelValue(v) {
			errs = append(errs, field.Invalid(p, v, msg))
		}
	}
	types := []string{"VPC", "INTERNET"}
	if !contains(types, c.Workload.ConnectedOver) {
		errs = append(errs, field.NotSupported(w.Child("connectedOver"), c.Workload.ConnectedOver, types))
	}
	for i, a := range c.Workload.Addresses {
		p := w.Child("addresses").Index(i)
		if ip := net.ParseIP(a.IP); ip == nil {
			errs = append(errs, field.Invalid(p.Child("ip"), a.IP, "must be an IP address"))
		}
		if !contains(types, a.Type) {
			errs = append(errs, field.NotSupported(p.Child("type"), a.Type, types))
		}
	}
	return errs
}

// Address returns the endpoint's host:port (port defaulted).
func (c *OnboardingConfiguration) Address() string {
	host, port, _ := SplitHostPort(c.OnboardingEndpoint.Host)
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// ServerName is the TLS server name of the endpoint.
func (c *OnboardingConfiguration) ServerName() string {
	if c.OnboardingEndpoint.TLSServerName != "" {
		return c.OnboardingEndpoint.TLSServerName
	}
	host, _, _ := SplitHostPort(c.OnboardingEndpoint.Host)
	return host
}

// Audience is the audience the STS proof is bound to: the endpoint's host.
func (c *OnboardingConfiguration) Audience() string {
	if c.OnboardingEndpoint.Audience != "" {
		return c.OnboardingEndpoint.Audience
	}
	return c.ServerName()
}

// SplitHostPort splits host[:port], defaulting the port to 15443.
func SplitHostPort(s string) (string, int, error) {
	host, portStr := s, ""
	if h, p, err := net.SplitHostPort(s); err == nil {
		host, portStr = h, p
	} else if strings.Count(s, ":") > 1 && !strings.HasPrefix(s, "[") {
		host = s // a bare IPv6 address
	} else if strings.Contains(s, ":") {
		return "", 0, fmt.Errorf("not host[:port]: %w", err)
	}
	if host == "" {
		return "", 0, errors.New("empty host")
	}
	if net.ParseIP(host) == nil {
		if msgs := validation.IsDNS1123Subdomain(strings.ToLower(host)); len(msgs) > 0 {
			return "", 0, fmt.Errorf("host %q: %s", host, strings.Join(msgs, "; "))
		}
	}
	if portStr == "" {
		return host, DefaultEndpointPort, nil
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("port %q must be a number from 1 to 65535", portStr)
	}
	return host, port, nil
}

// unitName is a systemd service unit name.
var unitName = regexp.MustCompile(`^[A-Za-z0-9:_.\\@-]{1,240}\.service$`)

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// validateDNSAddress checks the DNS proxy's listen address: a loopback IP
// (the proxy answers this host only) and a port from 1 to 65535 other than
// 53 (pilot-agent, as istio-proxy, binds :53 only as root and otherwise
// falls back to localhost:15053, where nothing would ask it).
func validateDNSAddress(p *field.Path, addr string) field.ErrorList {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return field.ErrorList{field.Invalid(p, addr, "must be ip:port")}
	}
	var errs field.ErrorList
	if ip, err := netip.ParseAddr(host); err != nil || !ip.IsLoopback() || ip.Zone() != "" {
		errs = append(errs, field.Invalid(p, addr, "the host must be a loopback IP address such as 127.0.0.1"))
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || n == 53 {
		errs = append(errs, field.Invalid(p, addr, "the port must be 1-65535 and not 53"))
	}
	return errs
}
