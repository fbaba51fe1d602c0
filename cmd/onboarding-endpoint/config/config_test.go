package config

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/limits"
)

const minimal = `apiVersion: config.onboarding.tetrate.io/v1alpha1
kind: OnboardingEndpointConfiguration
endpoint:
  hosts: [onboarding-endpoint.example.corp]
  secretName: onboarding-endpoint-tls-cert
`

func TestParseDefaults(t *testing.T) {
	cfg, err := Parse([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		got, want any
	}{
		{"token expiration", cfg.TokenIssuer.JWT.Expiration.Duration, time.Hour},
		{"grace period", cfg.Registration.GracePeriod.Duration, 5 * time.Minute},
		{"never connected after", cfg.Registration.NeverConnectedAfter.Duration, time.Minute},
		{"out of traffic after", cfg.Registration.OutOfTrafficAfter.Duration, 10 * time.Second},
		{"health damping", cfg.Registration.HealthDamping.Duration, 10 * time.Second},
		{"namespace", cfg.Namespace, "istio-system"},
		{"discovery address", cfg.Mesh.DiscoveryAddress, "onboarding-endpoint.example.corp:15012"},
		{"audience", cfg.Audience(), "onboarding-endpoint.example.corp"},
		{"local repository off", cfg.LocalRepository == nil, true},
		{"onboarding listen", cfg.Listen.Onboarding, ":15443"},
		{"xds debounce", cfg.XDS.Debounce.Duration, 100 * time.Millisecond},
		{"root namespace", cfg.Mesh.RootNamespace, "istio-system"},
		{"no istiod", cfg.Istiod.Enabled(), false},
		{"certificate validity cap", cfg.Istiod.MaxCertificateValidity.Duration, 24 * time.Hour},
		{"generic denials for every source", len(cfg.Endpoint.DetailedDenialSources), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
}

// registration.outOfTrafficAfter defaults to 10s, capped at the grace
// period; an explicit value stands.
func TestOutOfTrafficAfterDefaults(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want time.Duration
	}{
		{name: "default", yaml: "", want: 10 * time.Second},
		{name: "zero is the default", yaml: "registration: {outOfTrafficAfter: 0s}\n", want: 10 * time.Second},
		{name: "short grace period caps the default", yaml: "registration: {gracePeriod: 4s}\n", want: 4 * time.Second},
		{name: "explicit", yaml: "registration: {outOfTrafficAfter: 3s}\n", want: 3 * time.Second},
		{name: "explicit equal to the grace period", yaml: "registration: {gracePeriod: 30s, outOfTrafficAfter: 30s}\n", want: 30 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(minimal + tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.Registration.OutOfTrafficAfter.Duration; got != tt.want {
				t.Errorf("outOfTrafficAfter = %v, want %v", got, tt.want)
			}
		})
	}
}

const plaintext = `apiVersion: config.onboarding.tetrate.io/v1alpha1
kind: OnboardingEndpointConfiguration
endpoint:
  hosts: [onboarding-endpoint.example.corp]
  plaintext: true
`

// endpoint.plaintext is accepted on loopback listen addresses only.
func TestPlaintextOnLoopback(t *testing.T) {
	for _, listen := range []string{
		"listen: {onboarding: '127.0.0.1:15443', xds: '127.0.0.1:15012'}",
		"listen: {onboarding: '[::1]:15443', xds: 'localhost:15012', repository: '127.0.0.2:8443'}\nlocalRepository: {}",
		// The repository is not served without localRepository.
		"listen: {onboarding: '127.0.0.1:15443', xds: '127.0.0.1:15012', repository: ':8443'}",
	} {
		if _, err := Parse([]byte(plaintext + listen + "\n")); err != nil {
			t.Errorf("%s: %v", listen, err)
		}
	}
}

// Every limit has its default; a zero written in the file means the
// default too; a set value is kept.
func TestLimitsDefaults(t *testing.T) {
	cfg, err := Parse([]byte(minimal + "limits: {xds: {maxConnectionsPerSource: 0, firstRequestTimeout: 0s, requestsPerSecondPerSource: 5}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name      string
		got, want any
	}{
		{"xds per-source connections (zero)", cfg.Limits.XDS.MaxConnectionsPerSource, limits.DefaultMaxConnectionsPerSource},
		{"xds first request (zero)", cfg.Limits.XDS.FirstRequestTimeout.Duration, limits.DefaultFirstRequestTimeout},
		{"xds rate (set)", cfg.Limits.XDS.RequestsPerSecondPerSource, 5.0},
		{"onboarding rate", cfg.Limits.Onboarding.RequestsPerSecondPerSource, float64(limits.DefaultRequestsPerSecondPerSource)},
		{"onboarding streams", cfg.Limits.Onboarding.MaxConcurrentStreams, uint32(limits.DefaultMaxConcurrentStreams)},
		{"onboarding keepalive", cfg.Limits.Onboarding.KeepaliveMinTime.Duration, limits.DefaultKeepaliveMinTime},
		{"repository write timeout", cfg.Limits.Repository.HTTPWriteTimeout.Duration, limits.DefaultHTTPWriteTimeout},
		{"repository read-header timeout", cfg.Limits.Repository.HTTPReadHeaderTimeout.Duration, limits.DefaultHTTPReadHeaderTimeout},
		{"repository connections", cfg.Limits.Repository.MaxConnections, limits.DefaultMaxConnections},
		{"xds subscribed names per type", cfg.Limits.XDS.MaxSubscribedNamesPerType, 10_000},
		{"xds subscribed name bytes per stream", cfg.Limits.XDS.MaxSubscribedNameBytesPerStream, 1 << 20},
	} {
		if tt.got != tt.want {
			t.Errorf("%s = %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

func TestParseSeed004Shape(t *testing.T) {
	cfg, err := Parse([]byte(minimal + `tokenIssuer:
  jwt:
    expiration: 30m
localRepository: {}
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TokenIssuer.JWT.Expiration.Duration != 30*time.Minute {
		t.Errorf("expiration = %v", cfg.TokenIssuer.JWT.Expiration)
	}
	if cfg.LocalRepository == nil || cfg.LocalRepository.Directory != DefaultRepositoryDir {
		t.Errorf("localRepository = %+v", cfg.LocalRepository)
	}
}

func TestParseIstiod(t *testing.T) {
	tests := []struct {
		name           string
		yaml           string
		wantServerName string
	}{
		{name: "server name from address", yaml: "istiod: {address: 'istiod.istio-system.svc:15012', rootCertFile: /etc/istio/root-cert.pem}\n", wantServerName: "istiod.istio-system.svc"},
		{name: "server name set", yaml: "istiod: {address: '10.0.0.1:15012', serverName: istiod.istio-system.svc, rootCertFile: /r}\n", wantServerName: "istiod.istio-system.svc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(minimal + tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if !cfg.Istiod.Enabled() || cfg.Istiod.ServerName != tt.wantServerName {
				t.Errorf("istiod = %+v, want enabled with server name %q", cfg.Istiod, tt.wantServerName)
			}
		})
	}
}

// identity.gce.instanceCheck is enabled by its presence, even empty, and
// keeps what it is given.
func TestParseGCEInstanceCheck(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want *GCEInstanceCheck
	}{
		{name: "unset", yaml: "identity: {gce: {}}\n"},
		{name: "empty enables", yaml: "identity: {gce: {instanceCheck: {}}}\n", want: &GCEInstanceCheck{}},
		{name: "every field", yaml: "identity: {gce: {instanceCheck: {credentialsFile: /etc/embark/gcp/key.json, ratePerSecond: 2.5, burst: 4, cacheTTL: 1m, computeEndpoint: 'http://127.0.0.1:8080'}}}\n",
			want: &GCEInstanceCheck{CredentialsFile: "/etc/embark/gcp/key.json", APICallBudget: APICallBudget{RatePerSecond: 2.5, Burst: 4, CacheTTL: &metav1.Duration{Duration: time.Minute}}, ComputeEndpoint: "http://127.0.0.1:8080"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(minimal + tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			got := cfg.Identity.GCE.InstanceCheck
			if (got == nil) != (tt.want == nil) || (got != nil && !reflect.DeepEqual(*got, *tt.want)) {
				t.Errorf("instanceCheck = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// istiod.revisions are parsed as given; a revision without its own roots
// uses the default revision's.
func TestParseIstiodRevisions(t *testing.T) {
	cfg, err := Parse([]byte(minimal + "istiod: {address: 'istiod.istio-system.svc:15012', rootCertFile: /r, revisions: [{name: canary, address: 'istiod-canary.istio-system.svc:15012'}, {name: 1-26-0, address: 'istiod-1-26-0.istio-system.svc:15012', serverName: istiod-1-26-0.istio-system.svc, rootCertFile: /r2}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []IstiodRevision{
		{Name: "canary", Address: "istiod-canary.istio-system.svc:15012"},
		{Name: "1-26-0", Address: "istiod-1-26-0.istio-system.svc:15012", ServerName: "istiod-1-26-0.istio-system.svc", RootCertFile: "/r2"},
	}
	if !reflect.DeepEqual(cfg.Istiod.Revisions, want) {
		t.Fatalf("revisions = %+v, want %+v", cfg.Istiod.Revisions, want)
	}
	if got := cfg.Istiod.RootCertFileOf(want[0]); got != "/r" {
		t.Errorf("roots of canary = %q, want the default revision's /r", got)
	}
	if got := cfg.Istiod.RootCertFileOf(want[1]); got != "/r2" {
		t.Errorf("roots of 1-26-0 = %q, want its own /r2", got)
	}
}

func TestParseIstiodMode(t *testing.T) {
	const istiod = "istiod: {address: 'istiod.istio-system.svc:15012', rootCertFile: /r"
	tests := []struct {
		name       string
		yaml       string
		wantRelays bool
	}{
		{name: "no istiod: standalone", yaml: "", wantRelays: false},
		{name: "istiod: istiod mode by default", yaml: istiod + "}\n", wantRelays: true},
		{name: "istiod mode asked", yaml: istiod + ", relayXDS: true}\n", wantRelays: true},
		{name: "istiod for certificates only: standalone", yaml: istiod + ", relayXDS: false}\n", wantRelays: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(minimal + tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.Istiod.Relays(); got != tt.wantRelays {
				t.Errorf("Relays() = %v, want %v", got, tt.wantRelays)
			}
		})
	}
}

func TestParseRefusesNamingTheField(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		wantErr string
	}{
		{name: "empty", yaml: "", wantErr: "empty configuration"},
		{name: "relay without istiod", yaml: minimal + "istiod: {relayXDS: true}\n", wantErr: "istiod.address: Required value"},
		{name: "wrong kind", yaml: strings.Replace(minimal, "OnboardingEndpointConfiguration", "Other", 1), wantErr: "kind: Unsupported value"},
		{name: "unknown field", yaml: minimal + "tokenIssuer: {jwt: {expiry: 1h}}\n", wantErr: `unknown field "expiry"`},
		{name: "no hosts", yaml: strings.Replace(minimal, "hosts: [onboarding-endpoint.example.corp]", "hosts: []", 1), wantErr: "endpoint.hosts: Required value"},
		{name: "bad host", yaml: strings.Replace(minimal, "onboarding-endpoint.example.corp", "Bad_Host", 1), wantErr: "endpoint.hosts[0]"},
		{name: "no TLS", yaml: strings.Replace(minimal, "  secretName: onboarding-endpoint-tls-cert\n", "", 1), wantErr: "endpoint.secretName: Required value"},
		{name: "secret and files", yaml: minimal + "  certFile: /c\n  keyFile: /k\n", wantErr: "endpoint.secretName: Invalid value"},
		{name: "expiration too long", yaml: minimal + "tokenIssuer: {jwt: {expiration: 48h}}\n", wantErr: "tokenIssuer.jwt.expiration"},
		{name: "expiration not a duration", yaml: minimal + "tokenIssuer: {jwt: {expiration: soon}}\n", wantErr: "soon"},
		{name: "grace period too short", yaml: minimal + "registration: {gracePeriod: 10ms}\n", wantErr: "registration.gracePeriod"},
		{name: "negative health damping", yaml: minimal + "registration: {healthDamping: -1s}\n", wantErr: "registration.healthDamping"},
		{name: "metadata validity too short", yaml: minimal + "localRepository: {metadataValidity: 10m}\n", wantErr: "localRepository.metadataValidity"},
		{name: "detailed denials not a CIDR", yaml: minimal + "  detailedDenialSources: [10.0.0.0/8, admins]\n", wantErr: "endpoint.detailedDenialSources[1]"},
		{name: "jwt issuer with both jwks and jwksURL", yaml: minimal + "identity: {jwt: [{issuer: 'https://idp.example', shortName: idp, jwks: '{}', jwksURL: 'https://idp.example/keys'}]}\n", wantErr: "identity.jwt[0].jwks"},
		{name: "jwt negative maxTokenLifetime", yaml: minimal + "identity: {jwt: [{issuer: 'https://idp.example', shortName: idp, maxTokenLifetime: -1m}]}\n", wantErr: "identity.jwt[0].maxTokenLifetime"},
		{name: "gce jwksURL not https", yaml: minimal + "identity: {gce: {jwksURL: 'http://keys.example/certs'}}\n", wantErr: "identity.gce.jwksURL"},
		{name: "gce negative maxTokenLifetime", yaml: minimal + "identity: {gce: {maxTokenLifetime: -1m}}\n", wantErr: "identity.gce.maxTokenLifetime"},
		{name: "azure without tenants", yaml: minimal + "identity: {azure: {}}\n", wantErr: "identity.azure.tenants"},
		{name: "azure tenant not a GUID", yaml: minimal + "identity: {azure: {tenants: [contoso.onmicrosoft.com]}}\n", wantErr: "identity.azure.tenants[0]"},
		{name: "azure tenant twice", yaml: minimal + "identity: {azure: {tenants: [72f988bf-86f1-41af-91ab-2d7cd011db47, 72F988BF-86F1-41AF-91AB-2D7CD011DB47]}}\n", wantErr: "identity.azure.tenants[1]"},
		{name: "azure jwksURL not https", yaml: minimal + "identity: {azure: {tenants: [72f988bf-86f1-41af-91ab-2d7cd011db47], jwksURL: 'http://keys.example/{tenant}'}}\n", wantErr: "identity.azure.jwksURL"},
		{name: "ecs taskCheck endpoint not a URL", yaml: minimal + "identity: {ecs: {taskCheck: {ecsEndpoint: 'ecs.internal'}}}\n", wantErr: "identity.ecs.taskCheck.ecsEndpoint"},
		{name: "gce instanceCheck endpoint not a URL", yaml: minimal + "identity: {gce: {instanceCheck: {computeEndpoint: 'compute.internal'}}}\n", wantErr: "identity.gce.instanceCheck.computeEndpoint"},
		{name: "gce instanceCheck negative rate", yaml: minimal + "identity: {gce: {instanceCheck: {ratePerSecond: -1}}}\n", wantErr: "identity.gce.instanceCheck.ratePerSecond"},
		{name: "gce instanceCheck negative burst", yaml: minimal + "identity: {gce: {instanceCheck: {burst: -1}}}\n", wantErr: "identity.gce.instanceCheck.burst"},
		{name: "gce instanceCheck negative cacheTTL", yaml: minimal + "identity: {gce: {instanceCheck: {cacheTTL: -1s}}}\n", wantErr: "identity.gce.instanceCheck.cacheTTL"},
		{name: "gce instanceCheck unknown field", yaml: minimal + "identity: {gce: {instanceCheck: {roleARN: x}}}\n", wantErr: `unknown field "roleARN"`},
		{name: "azure vmCheck armEndpoint not a URL", yaml: minimal + "identity: {azure: {tenants: [72f988bf-86f1-41af-91ab-2d7cd011db47], vmCheck: {armEndpoint: 'management.internal'}}}\n", wantErr: "identity.azure.vmCheck.armEndpoint"},
		{name: "azure vmCheck imdsEndpoint with a query", yaml: minimal + "identity: {azure: {tenants: [72f988bf-86f1-41af-91ab-2d7cd011db47], vmCheck: {imdsEndpoint: 'http://169.254.169.254/?x=1'}}}\n", wantErr: "identity.azure.vmCheck.imdsEndpoint"},
		{name: "azure vmCheck negative rate", yaml: minimal + "identity: {azure: {tenants: [72f988bf-86f1-41af-91ab-2d7cd011db47], vmCheck: {ratePerSecond: -1}}}\n", wantErr: "identity.azure.vmCheck.ratePerSecond"},
		{name: "azure vmCheck negative burst", yaml: minimal + "identity: {azure: {tenants: [72f988bf-86f1-41af-91ab-2d7cd011db47], vmCheck: {burst: -1}}}\n", wantErr: "identity.azure.vmCheck.burst"},
		{name: "azure vmCheck negative cacheTTL", yaml: minimal + "identity: {azure: {tenants: [72f988bf-86f1-41af-91ab-2d7cd011db47], vmCheck: {cacheTTL: -1s}}}\n", wantErr: "identity.azure.vmCheck.cacheTTL"},
		{name: "ecs taskCheck negative rate", yaml: minimal + "identity: {ecs: {taskCheck: {ratePerSecond: -1}}}\n", wantErr: "identity.ecs.taskCheck.ratePerSecond"},
		{name: "aws instanceProfileCheck negative rate", yaml: minimal + "identity: {aws: {instanceProfileCheck: {ratePerSecond: -1}}}\n", wantErr: "identity.aws.instanceProfileCheck.ratePerSecond"},
		{name: "aws instanceProfileCheck negative cacheTTL", yaml: minimal + "identity: {aws: {instanceProfileCheck: {cacheTTL: -1s}}}\n", wantErr: "identity.aws.instanceProfileCheck.cacheTTL"},
		{name: "negative outOfTrafficAfter", yaml: minimal + "registration: {outOfTrafficAfter: -1s}\n", wantErr: "registration.outOfTrafficAfter: Invalid value"},
		{name: "outOfTrafficAfter beyond the grace period", yaml: minimal + "registration: {gracePeriod: 1m, outOfTrafficAfter: 2m}\n", wantErr: "must not exceed registration.gracePeriod"},
		{name: "negative neverConnectedAfter", yaml: minimal + "registration: {neverConnectedAfter: -1s}\n", wantErr: "registration.neverConnectedAfter"},
		{name: "istiod without roots", yaml: minimal + "istiod: {address: 'istiod.istio-system.svc:15012'}\n", wantErr: "istiod.rootCertFile: Required value"},
		{name: "istiod without port", yaml: minimal + "istiod: {address: istiod, rootCertFile: /r}\n", wantErr: "istiod.address: Invalid value"},
		{name: "istiod roots without address", yaml: minimal + "istiod: {rootCertFile: /r}\n", wantErr: "istiod.address: Required value"},
		{name: "revisions without istiod", yaml: minimal + "istiod: {revisions: [{name: canary, address: 'c:15012'}]}\n", wantErr: "istiod.address: Required value"},
		{name: "revision without a name", yaml: minimal + "istiod: {address: 'i:15012', rootCertFile: /r, revisions: [{address: 'c:15012'}]}\n", wantErr: "istiod.revisions[0].name: Invalid value"},
		{name: "revision named default", yaml: minimal + "istiod: {address: 'i:15012', rootCertFile: /r, revisions: [{name: default, address: 'c:15012'}]}\n", wantErr: "istiod.revisions[0].name: Invalid value: \"default\": is the default revision's name"},
		{name: "revision named as the default one", yaml: minimal + "istiod: {address: 'i:15012', rootCertFile: /r, revision: stable, revisions: [{name: stable, address: 'c:15012'}]}\n", wantErr: "istiod.revisions[0].name: Invalid value: \"stable\""},
		{name: "revision twice", yaml: minimal + "istiod: {address: 'i:15012', rootCertFile: /r, revisions: [{name: canary, address: 'c:15012'}, {name: canary, address: 'd:15012'}]}\n", wantErr: "istiod.revisions[1].name: Duplicate value"},
		{name: "revision without port", yaml: minimal + "istiod: {address: 'i:15012', rootCertFile: /r, revisions: [{name: canary, address: c}]}\n", wantErr: "istiod.revisions[0].address: Invalid value"},
		{name: "revision not a DNS label", yaml: minimal + "istiod: {address: 'i:15012', rootCertFile: /r, revisions: [{name: Canary, address: 'c:15012'}]}\n", wantErr: "istiod.revisions[0].name: Invalid value"},
		{name: "workload namespace not a DNS label", yaml: minimal + "workloadNamespaces: [Bookinfo]\n", wantErr: "workloadNamespaces[0]"},
		{name: "workload namespace twice", yaml: minimal + "workloadNamespaces: [bookinfo, bookinfo]\n", wantErr: "workloadNamespaces[1]: Duplicate value"},
		{name: "jwt duplicate short name", yaml: minimal + "identity: {jwt: [{issuer: 'https://a', shortName: idp, jwksURL: 'https://a/keys'}, {issuer: 'https://b', shortName: idp, jwksURL: 'https://b/keys'}]}\n", wantErr: "identity.jwt[1].shortName: Duplicate value"},
		{name: "bad listen", yaml: minimal + "listen: {xds: '15012'}\n", wantErr: "listen.xds"},
		{name: "debounce too long", yaml: minimal + "xds: {debounce: 1m}\n", wantErr: "xds.debounce"},
		{name: "debounce zero", yaml: minimal + "xds: {debounce: 0s}\n", wantErr: "xds.debounce"},
		{name: "bad root namespace", yaml: minimal + "mesh: {rootNamespace: Istio_System}\n", wantErr: "mesh.rootNamespace"},
		{name: "plaintext on every interface", yaml: plaintext + "listen: {onboarding: '127.0.0.1:1', xds: ':15012'}\n", wantErr: "listen.xds: Invalid value: \":15012\": endpoint.plaintext serves without TLS"},
		{name: "plaintext on a routable address", yaml: plaintext + "listen: {onboarding: '10.0.0.1:15443', xds: '127.0.0.1:1'}\n", wantErr: "listen.onboarding"},
		{name: "plaintext repository on every interface", yaml: plaintext + "listen: {onboarding: '127.0.0.1:1', xds: '[::1]:2', repository: '0.0.0.0:8443'}\nlocalRepository: {}\n", wantErr: "listen.repository"},
		{name: "plaintext by default listen addresses", yaml: plaintext, wantErr: "listen.onboarding"},
		{name: "empty extra repository directory", yaml: minimal + "localRepository: {extraDirectories: ['']}\n", wantErr: "localRepository.extraDirectories[0]: Required value"},
		{name: "extra repository directory the main one", yaml: minimal + "localRepository: {directory: /srv/repo, extraDirectories: [/srv/sidecar, /srv/repo/]}\n", wantErr: "localRepository.extraDirectories[1]: Duplicate value"},
		{name: "published repository keys without a signing key", yaml: minimal + "localRepository: {publicKeyFiles: [/keys/next.asc]}\n", wantErr: "localRepository.signingKeyFile: Required value"},
		{name: "negative per-source connections", yaml: minimal + "limits: {xds: {maxConnectionsPerSource: -1}}\n", wantErr: "limits.xds.maxConnectionsPerSource"},
		{name: "negative first request timeout", yaml: minimal + "limits: {xds: {firstRequestTimeout: -1s}}\n", wantErr: "limits.xds.firstRequestTimeout"},
		{name: "certificate validity over 90 days", yaml: minimal + "istiod: {maxCertificateValidity: 2161h}\n", wantErr: "istiod.maxCertificateValidity: Invalid value: \"2161h0m0s\": must be between 10m0s and 2160h0m0s"},
		{name: "certificate relay negative rate", yaml: minimal + "istiod: {address: 'istiod:15012', rootCertFile: /r, certificateRelay: {requestsPerSecond: -1}}\n", wantErr: "istiod.certificateRelay.requestsPerSecond"},
		{name: "certificate relay negative burst", yaml: minimal + "istiod: {address: 'istiod:15012', rootCertFile: /r, certificateRelay: {burst: -1}}\n", wantErr: "istiod.certificateRelay.burst"},
		{name: "certificate relay in flight too many", yaml: minimal + "istiod: {address: 'istiod:15012', rootCertFile: /r, certificateRelay: {maxInFlight: 5000}}\n", wantErr: "istiod.certificateRelay.maxInFlight: Invalid value: 5000: must be between 0 (the default) and 4096"},
		{name: "certificate validity under 10 minutes", yaml: minimal + "istiod: {maxCertificateValidity: 1m}\n", wantErr: "istiod.maxCertificateValidity"},
		{name: "negative subscribed names per type", yaml: minimal + "limits: {xds: {maxSubscribedNamesPerType: -1}}\n", wantErr: "limits.xds.maxSubscribedNamesPerType"},
		{name: "subscribed name bytes over the message limit", yaml: minimal + "limits: {xds: {maxSubscribedNameBytesPerStream: 4194304}}\n", wantErr: "limits.xds.maxSubscribedNameBytesPerStream"},
		{name: "network without the pods' network", yaml: minimal + "mesh: {network: {gateways: [virtual-machines]}}\n", wantErr: "mesh.network.pods: Required value"},
		{name: "network name not a label value", yaml: minimal + "mesh: {network: {pods: kube-network, gateways: ['virtual machines']}}\n", wantErr: "mesh.network.gateways[0]: Invalid value"},
		{name: "gateway network twice", yaml: minimal + "mesh: {network: {pods: kube-network, gateways: [vms, kube-network]}}\n", wantErr: "mesh.network.gateways[1]: Duplicate value"},
		{name: "pod CIDR not a CIDR", yaml: minimal + "mesh: {network: {pods: kube-network, podCIDRs: [10.244.0.1]}}\n", wantErr: "mesh.network.podCIDRs[0]"},
		{name: "per-source above total", yaml: minimal + "limits: {onboarding: {maxConnectionsPerSource: 20, maxConnections: 10}}\n", wantErr: "limits.onboarding.maxConnectionsPerSource"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("err = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(minimal))
	f.Add([]byte(minimal + "registration: {gracePeriod: 1s}\n"))
	f.Add([]byte("{"))
	f.Add([]byte(minimal + "xds: {debounce: 250ms}\nmesh: {rootNamespace: mesh-config}\n"))
	f.Add([]byte(minimal + "mesh: {network: {pods: kube-network, podCIDRs: [10.244.0.0/16], gateways: [virtual-machines]}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data)
		if err != nil {
			return
		}
		// Whatever parses is complete: defaults set, invariants hold.
		if len(cfg.Endpoint.Hosts) == 0 || cfg.TokenIssuer.JWT.Expiration == nil || cfg.Registration.GracePeriod == nil || cfg.XDS.Debounce == nil {
			t.Fatalf("accepted an incomplete configuration: %+v", cfg)
		}
		if errs := cfg.Validate(); len(errs) > 0 {
			t.Fatalf("accepted an invalid configuration: %v", errs)
		}
	})
}

// localRepository.metadataValidity defaults to 7 days; a set value is kept.
func TestMetadataValidity(t *testing.T) {
	for _, tt := range []struct {
		name, yaml string
		want       time.Duration
	}{
		{name: "default", yaml: "localRepository: {}\n", want: 7 * 24 * time.Hour},
		{name: "set", yaml: "localRepository: {metadataValidity: 36h}\n", want: 36 * time.Hour},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(minimal + tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.LocalRepository.MetadataValidity.Duration; got != tt.want {
				t.Errorf("metadataValidity %v, want %v", got, tt.want)
			}
		})
	}
}

// identity.azure.vmCheck turns the Resource Manager check on even when it
// is {}; without it the check is off.
func TestParseAzureVMCheck(t *testing.T) {
	const azure = "identity: {azure: {tenants: [72f988bf-86f1-41af-91ab-2d7cd011db47]"
	for _, tt := range []struct {
		name, yaml string
		wantOn     bool
		wantARM    string
	}{
		{name: "not set: off", yaml: azure + "}}\n"},
		{name: "{}: on with defaults", yaml: azure + ", vmCheck: {}}}\n", wantOn: true},
		{name: "armEndpoint set", yaml: azure + ", vmCheck: {armEndpoint: 'http://127.0.0.1:9000', ratePerSecond: 2, burst: 4, cacheTTL: 1m}}}\n", wantOn: true, wantARM: "http://127.0.0.1:9000"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(minimal + tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			vc := cfg.Identity.Azure.VMCheck
			if (vc != nil) != tt.wantOn || (vc != nil && vc.ARMEndpoint != tt.wantARM) {
				t.Errorf("vmCheck = %+v, want on %v with armEndpoint %q", vc, tt.wantOn, tt.wantARM)
			}
		})
	}
}

// A configuration that does not set istiod.certificateRelay writes none
// back (an earlier release's strict parser refuses the field), and one that
// sets it keeps what it gives.
func TestCertificateRelayOnlyWhenSet(t *testing.T) {
	istiod := "istiod: {address: 'istiod.istio-system.svc:15012', rootCertFile: /r}\n"
	cfg, err := Parse([]byte(minimal + istiod))
	if err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "certificateRelay") {
		t.Errorf("a configuration without istiod.certificateRelay marshals one: %s", out)
	}
	set := "istiod: {address: 'istiod.istio-system.svc:15012', rootCertFile: /r, certificateRelay: {requestsPerSecond: 200, burst: 400, maxInFlight: 128}}\n"
	if cfg, err = Parse([]byte(minimal + set)); err != nil {
		t.Fatal(err)
	}
	want := CertificateRelay{RequestsPerSecond: 200, Burst: 400, MaxInFlight: 128}
	if cfg.Istiod.CertificateRelay == nil || *cfg.Istiod.CertificateRelay != want {
		t.Errorf("istiod.certificateRelay = %+v, want %+v", cfg.Istiod.CertificateRelay, want)
	}
}
