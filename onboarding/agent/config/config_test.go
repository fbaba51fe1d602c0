package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const goodAgent = `apiVersion: config.agent.onboarding.tetrate.io/v1alpha1
kind: AgentConfiguration
host:
  platform: jwt
  jwt:
    command: ["/usr/local/bin/get-jwt", "--audience", "onboarding"]
sidecar:
  istio:
    revision: canary
  bootstrap:
    token: /run/istio/token
  restartCommand: ["/bin/true"]
  stopCommand: ["/bin/true"]
`

const goodOnboarding = `apiVersion: config.agent.onboarding.tetrate.io/v1alpha1
kind: OnboardingConfiguration
onboardingEndpoint:
  host: onboarding-endpoint.example
workload:
  namespace: bookinfo
  name: ratings
  labels:
    version: v5
  addresses:
  - ip: 10.0.0.7
`

func TestParseAgentDefaults(t *testing.T) {
	cfg, err := ParseAgent([]byte(goodAgent))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Sidecar.Bootstrap.ClusterEnv; got != DefaultClusterEnvFile {
		t.Errorf("clusterEnv = %q, want default %q", got, DefaultClusterEnvFile)
	}
	if got := cfg.Sidecar.Bootstrap.Token; got != "/run/istio/token" {
		t.Errorf("token = %q", got)
	}
	if !cfg.Sidecar.Direct() || cfg.Sidecar.Unit != DefaultSidecarUnit {
		t.Errorf("sidecar = %+v, want commands and unit %s", cfg.Sidecar, DefaultSidecarUnit)
	}
	if cfg.Host.JWT.Timeout.Duration != DefaultCredentialTimeout {
		t.Errorf("timeout = %v", cfg.Host.JWT.Timeout.Duration)
	}
	minimal, err := ParseAgent([]byte("apiVersion: " + APIVersion + "\nkind: AgentConfiguration\n"))
	if err != nil {
		t.Fatal(err)
	}
	if minimal.Host.Platform != PlatformAuto || minimal.Sidecar.Direct() || minimal.Sidecar.Unit != "istio.service" ||
		minimal.Sidecar.StagingDir != DefaultStagingDir || minimal.Sidecar.CAAddress != "" ||
		minimal.Metrics.Address != "" || minimal.Metrics.SidecarReadyURL != DefaultSidecarReadyURL {
		t.Errorf("minimal defaults: %+v", minimal)
	}
	if d := minimal.Sidecar.DNS; !d.On() || d.Address != DefaultDNSAddress || d.AutoAllocate {
		t.Errorf("dns defaults: %+v, want on at %s without auto-allocation", d, DefaultDNSAddress)
	}
	off, err := ParseAgent([]byte("apiVersion: " + APIVersion + "\nkind: AgentConfiguration\nsidecar:\n  dns: {enabled: false}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if off.Sidecar.DNS.On() {
		t.Error("dns.enabled: false leaves the DNS proxy on")
	}
}

func TestParseOnboardingDefaults(t *testing.T) {
	cfg, err := ParseOnboarding([]byte(goodOnboarding))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Address(); got != "onboarding-endpoint.example:15443" {
		t.Errorf("Address() = %q", got)
	}
	if got := cfg.Audience(); got != "onboarding-endpoint.example" {
		t.Errorf("Audience() = %q", got)
	}
	if cfg.Workload.Addresses[0].Type != "VPC" || cfg.Workload.ConnectedOver != "VPC" {
		t.Errorf("address defaults: %+v", cfg.Workload)
	}
}

func TestParseErrorsNameTheField(t *testing.T) {
	tests := []struct {
		name      string
		agent     bool
		data      string
		wantField string
	}{
		{"empty", true, "", "empty configuration"},
		{"unknown field", true, goodAgent + "extra: 1\n", `unknown field "extra"`},
		{"nested unknown field", true, strings.Replace(goodAgent, "revision:", "revison:", 1), `unknown field "revison"`},
		{"wrong kind", true, strings.Replace(goodAgent, "AgentConfiguration", "Agent", 1), "kind"},
		{"bad platform", true, strings.Replace(goodAgent, "platform: jwt", "platform: gcp", 1), "host.platform"},
		{"jwt without source", true, strings.Replace(goodAgent, `command: ["/usr/local/bin/get-jwt", "--audience", "onboarding"]`, "{}", 1), "host.jwt"},
		{"relative path", true, strings.Replace(goodAgent, "/run/istio/token", "token", 1), "sidecar.bootstrap.token"},
		{"same file twice", true, strings.Replace(goodAgent, "token: /run/istio/token", "token: /etc/certs/embark-root-cert.pem", 1), "sidecar.bootstrap.token"},
		{"empty program", true, strings.Replace(goodAgent, `["/bin/true"]`, `[""]`, 1), "sidecar.restartCommand[0]"},
		{"restart without stop", true, strings.Replace(goodAgent, `  stopCommand: ["/bin/true"]`+"\n", "", 1), "sidecar.stopCommand"},
		{"bad unit", true, strings.Replace(goodAgent, "sidecar:\n", "sidecar:\n  unit: istio\n", 1), "sidecar.unit"},
		{"bad ca address", true, strings.Replace(goodAgent, "sidecar:\n", "sidecar:\n  caAddress: istiod\n", 1), "sidecar.caAddress"},
		{"dns address not loopback", true, strings.Replace(goodAgent, "sidecar:\n", "sidecar:\n  dns: {address: '10.0.0.7:15053'}\n", 1), "sidecar.dns.address"},
		{"dns address port 53", true, strings.Replace(goodAgent, "sidecar:\n", "sidecar:\n  dns: {address: '127.0.0.1:53'}\n", 1), "sidecar.dns.address"},
		{"dns address without port", true, strings.Replace(goodAgent, "sidecar:\n", "sidecar:\n  dns: {address: '127.0.0.1'}\n", 1), "sidecar.dns.address"},
		{"dns address name", true, strings.Replace(goodAgent, "sidecar:\n", "sidecar:\n  dns: {address: 'localhost:15053'}\n", 1), "sidecar.dns.address"},
		{"relative state directory", true, goodAgent + "stateDirectory: var/lib/onboarding-agent\n", "stateDirectory"},
		{"relative staging dir", true, strings.Replace(goodAgent, "sidecar:\n", "sidecar:\n  stagingDir: sidecar\n", 1), "sidecar.stagingDir"},
		{"bad revision", true, strings.Replace(goodAgent, "canary", "Canary_1", 1), "sidecar.istio.revision"},
		{"metrics on a public address", true, goodAgent + "metrics: {address: '0.0.0.0:15099'}\n", "metrics.address"},
		{"metrics on a host name", true, goodAgent + "metrics: {address: 'vm.example:15099'}\n", "metrics.address"},
		{"metrics without a port", true, goodAgent + "metrics: {address: '127.0.0.1'}\n", "metrics.address"},
		{"sidecar ready URL not http", true, goodAgent + "metrics: {address: '127.0.0.1:15099', sidecarReadyURL: 'file:///ready'}\n", "metrics.sidecarReadyURL"},
		{"bad imds url", true, strings.Replace(goodAgent, "platform: jwt", "platform: jwt\n  aws: {imdsEndpoint: 169.254.169.254}", 1), "host.aws.imdsEndpoint"},
		{"bad azure imds url", true, strings.Replace(goodAgent, "platform: jwt", "platform: azure\n  azure: {imdsEndpoint: 169.254.169.254}", 1), "host.azure.imdsEndpoint"},
		{"unknown azure field", true, strings.Replace(goodAgent, "platform: jwt", "platform: azure\n  azure: {audience: x}", 1), `unknown field "audience"`},
		{"wrong type", false, strings.Replace(goodOnboarding, "name: ratings", "name: [ratings]", 1), "workload.name"},
		{"missing host", false, strings.Replace(goodOnboarding, "host: onboarding-endpoint.example", "tlsServerName: x", 1), "onboardingEndpoint.host"},
		{"bad port", false, strings.Replace(goodOnboarding, "onboarding-endpoint.example", "onboarding-endpoint.example:99999", 1), "onboardingEndpoint.host"},
		{"bad namespace", false, strings.Replace(goodOnboarding, "bookinfo", "Book_Info", 1), "workload.namespace"},
		{"missing group", false, strings.Replace(goodOnboarding, "name: ratings", "", 1), "workload.name"},
		{"bad label", false, strings.Replace(goodOnboarding, "version: v5", "version: 'v 5'", 1), "workload.labels[version]"},
		{"bad address", false, strings.Replace(goodOnboarding, "10.0.0.7", "10.0.0", 1), "workload.addresses[0].ip"},
		{"bad address type", false, strings.Replace(goodOnboarding, "- ip: 10.0.0.7", "- ip: 10.0.0.7\n    type: PUBLIC", 1), "workload.addresses[0].type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.agent {
				_, err = ParseAgent([]byte(tt.data))
			} else {
				_, err = ParseOnboarding([]byte(tt.data))
			}
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tt.wantField) {
				t.Errorf("error %q does not name %q", err, tt.wantField)
			}
		})
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "onboarding.config.yaml")
	if err := os.WriteFile(p, []byte("kind: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadOnboarding(p)
	if err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("error %v does not name the file", err)
	}
	if _, err := LoadAgent(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("missing file accepted")
	}
}

func TestSplitHostPort(t *testing.T) {
	tests := []struct {
		in       string
		wantHost string
		wantPort int
		wantErr  bool
	}{
		{"onboarding.example", "onboarding.example", 15443, false},
		{"onboarding.example:443", "onboarding.example", 443, false},
		{"10.1.2.3", "10.1.2.3", 15443, false},
		{"[fd00::1]:8443", "fd00::1", 8443, false},
		{"fd00::1", "fd00::1", 15443, false},
		{":443", "", 0, true},
		{"a:b:c:d", "", 0, true},
		{"host:0", "", 0, true},
		{"under_score.example", "", 0, true},
	}
	for _, tt := range tests {
		host, port, err := SplitHostPort(tt.in)
		if (err != nil) != tt.wantErr || host != tt.wantHost || port != tt.wantPort {
			t.Errorf("SplitHostPort(%q) = %q, %d, %v; want %q, %d, err=%v", tt.in, host, port, err, tt.wantHost, tt.wantPort, tt.wantErr)
		}
	}
}

// The configuration files the onboarding-agent package installs: the agent
// configuration is valid as shipped; the onboarding configuration is a
// template that fails, naming the fields to fill in, until edited.
func TestPackagedConfigurationFiles(t *testing.T) {
	agent, err := LoadAgent("../packaging/agent.config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// Istio's own sidecar package, driven through the root-run
	// onboarding-agent-sidecar.service: no commands, no sudo.
	if agent.Sidecar.Direct() || agent.Sidecar.Unit != "istio.service" || agent.Sidecar.StagingDir != "/var/lib/onboarding-agent/sidecar" ||
		agent.Sidecar.Bootstrap != (BootstrapFiles{ClusterEnv: "/var/lib/istio/envoy/cluster.env", MeshConfig: "/etc/istio/config/mesh",
			RootCert: "/etc/certs/embark-root-cert.pem", Token: "/var/run/secrets/tokens/istio-token"}) {
		t.Errorf("packaged sidecar configuration %+v", agent.Sidecar)
	}
	if agent.Metrics.Address != "" {
		t.Errorf("the packaged configuration serves metrics on %s; it must be off unless the operator sets it", agent.Metrics.Address)
	}
	_, err = LoadOnboarding("../packaging/onboarding.config.yaml")
	for _, f := range []string{"onboardingEndpoint.host", "workload.namespace", "workload.name"} {
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("the template's error %v does not name %s", err, f)
		}
	}
}

// The metrics endpoint is off by default and accepted on loopback only.
func TestMetricsAddressLoopback(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:15099", "[::1]:15099", "localhost:15099", "127.0.0.2:1"} {
		if _, err := ParseAgent([]byte(goodAgent + "metrics: {address: '" + addr + "'}\n")); err != nil {
			t.Errorf("metrics.address %s: %v", addr, err)
		}
	}
}
