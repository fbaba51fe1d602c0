package configkit

import (
	"reflect"
	"testing"
	"time"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/config"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/limits"
)

// TestMarshalRoundTrips checks that every kind of configuration the tests
// build parses with config.Parse into what was built (defaults added).
func TestMarshalRoundTrips(t *testing.T) {
	relay := false
	tests := []struct {
		name  string
		build func(*config.Configuration)
	}{
		{name: "plaintext", build: func(*config.Configuration) {}},
		{name: "serving certificate and istiod", build: func(c *config.Configuration) {
			Serving(c, "/tls/cert.pem", "/tls/key.pem")
			c.Istiod = config.Istiod{Address: "127.0.0.1:15012", ServerName: "istiod.istio-system.svc", RootCertFile: "/istiod/root.pem",
				RelayXDS: &relay, Revision: "canary", MaxCertificateValidity: Duration(time.Hour)}
			c.Registration.GracePeriod = Duration(time.Hour)
		}},
		{name: "registration and mesh", build: func(c *config.Configuration) {
			c.Registration.AllowLoopbackAddresses = true
			c.Registration.HealthDamping = Duration(0)
			c.Registration.PropagationDelay = Duration(time.Second)
			c.Registration.SourceAddressCheck = &config.SourceAddressCheck{Enabled: true, TrustedProxyCIDRs: []string{"10.0.0.0/8"}}
			c.Mesh = config.Mesh{DiscoveryAddress: "127.0.0.1:15012", RootCertFile: "/ca.pem",
				Network: &config.MeshNetwork{Pods: "pods", PodCIDRs: []string{"10.244.0.0/16"}, Gateways: []string{"vms"}}}
			c.WorkloadNamespaces = []string{"a", "b"}
		}},
		{name: "identities", build: func(c *config.Configuration) {
			c.TokenIssuer.JWT.Expiration = Duration(time.Minute)
			c.Identity.AWS = config.AWSIdentity{CertificatesDir: "/aws", STSEndpoint: "http://127.0.0.1:1/",
				InstanceProfileCheck: &config.InstanceProfileCheck{EC2Endpoint: "http://127.0.0.1:2", IAMEndpoint: "http://127.0.0.1:2"}}
			c.Identity.JWT = []config.JWTIssuer{{Issuer: "https://issuer.example", ShortName: "corp", JWKS: `{"keys":[]}`, Attributes: map[string]string{"zone": "z"}}}
			c.Identity.GCE = &config.GCEIdentity{JWKSURL: "https://127.0.0.1:3/certs"}
			c.Identity.Azure = &config.AzureIdentity{Tenants: []string{"00000000-0000-0000-0000-000000000001"}}
			c.Identity.ECS = &config.ECSIdentity{}
		}},
		{name: "limits and repository", build: func(c *config.Configuration) {
			c.Limits.Onboarding = limits.Options{MaxConnectionsPerSource: 3, SourceExpiry: Duration(time.Minute)}
			c.Limits.XDS.FirstRequestTimeout = Duration(time.Second)
			c.LocalRepository = &config.LocalRepository{Directory: "/repo"}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			built := Config("ns")
			built.Listen = config.Listen{Onboarding: "127.0.0.1:1", Metrics: "127.0.0.1:2", XDS: "127.0.0.1:3", Repository: "127.0.0.1:4"}
			tt.build(built)
			data, err := Marshal(built)
			if err != nil {
				t.Fatal(err)
			}
			got, err := config.Parse(data)
			if err != nil {
				t.Fatalf("Parse of\n%s: %v", data, err)
			}
			built.SetDefaults()
			if !reflect.DeepEqual(got, built) {
				t.Errorf("Parse of\n%s\n= %+v\nwant %+v", data, got, built)
			}
		})
	}
}
