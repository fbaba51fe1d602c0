package platform

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/identity/azure"
	"github.com/embark-mesh/embark/onboarding/identity/azure/azuretest"
)

func TestDetectAzureAndCredential(t *testing.T) {
	ms, err := azuretest.NewMicrosoft()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ms.Close)
	vm := azuretest.DefaultVM()
	imds := azuretest.NewIMDS(ms, vm)
	t.Cleanup(imds.Close)
	dead := httptest.NewServer(nil)
	deadURL := dead.URL
	dead.Close()

	var logs bytes.Buffer
	cfg := config.Host{Platform: config.PlatformAuto, AWS: config.AWSPlatform{IMDSEndpoint: deadURL},
		GCE: config.GCEPlatform{MetadataEndpoint: deadURL}, Azure: config.AzurePlatform{IMDSEndpoint: imds.URL(), Resource: "api://embark-onboarding"}}
	p, err := Detect(t.Context(), cfg, "onboarding.example", testLogger(&logs))
	if err != nil {
		t.Fatal(err)
	}
	if p.Name() != "azure" || !strings.Contains(logs.String(), "azure detected") || !strings.Contains(logs.String(), vm.Location) {
		t.Fatalf("detected %s, logs %s", p.Name(), logs.String())
	}
	cred, err := p.Credential(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if cred.Azure.GetToken() == "" || cred.Address == nil || cred.Address.IP != vm.IP || cred.Address.Type != "VPC" {
		t.Fatalf("credential %+v address %+v", cred.Azure, cred.Address)
	}
	// The token is the endpoint's to verify: Microsoft-signed, for the
	// configured resource (not the endpoint's host name).
	v, err := azure.NewVerifier(azure.Config{Tenants: []string{vm.TenantID}, Audiences: []string{"api://embark-onboarding"}, JWKSURL: ms.JWKSURL(), CACertificates: ms.CACertificates()})
	if err != nil {
		t.Fatal(err)
	}
	id, err := v.Verify(t.Context(), cred.Azure.GetToken())
	if err != nil {
		t.Fatalf("the agent's token does not verify: %v", err)
	}
	if id.Azure.VMName != "ratings-1" || id.Azure.ResourceGroup != "embark-rg" {
		t.Errorf("identity %+v", id.Azure)
	}
}

func TestAzureRefusesAnswersThatAreNotTokens(t *testing.T) {
	for _, tt := range []struct {
		name, body string
		status     int
		want       string
	}{
		{"refusal", `{"error":"invalid_request","error_description":"Identity not found"}`, http.StatusBadRequest, "400 Bad Request: {\"error\":\"invalid_request\""},
		{"not JSON", "a.b.c", http.StatusOK, "not a token response"},
		{"no access_token", `{"token_type":"Bearer"}`, http.StatusOK, "no access_token"},
		{"access_token not a JWT", `{"access_token":"opaque"}`, http.StatusOK, "not a JWT"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Metadata") != "true" {
					t.Errorf("request without Metadata: true")
				}
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.body))
			}))
			t.Cleanup(srv.Close)
			p := NewAzure(config.AzurePlatform{IMDSEndpoint: srv.URL}, "aud", slog.New(slog.DiscardHandler))
			_, err := p.Credential(t.Context())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
		})
	}
}

func TestConfiguredAzure(t *testing.T) {
	var logs bytes.Buffer
	p, err := Detect(t.Context(), config.Host{Platform: config.PlatformAzure}, "onboarding.example", testLogger(&logs))
	if err != nil {
		t.Fatal(err)
	}
	if p.Name() != "azure" || !strings.Contains(logs.String(), DefaultAzureIMDSEndpoint) || !strings.Contains(logs.String(), "resource=onboarding.example") {
		t.Errorf("platform %s, logs %s", p.Name(), logs.String())
	}
}

func TestParseAzureNetwork(t *testing.T) {
	for _, tt := range []struct {
		name, body, want, wantErr string
	}{
		{"first interface's first address", `{"interface":[{"ipv4":{"ipAddress":[{"privateIpAddress":"10.1.0.4","publicIpAddress":"20.1.2.3"},{"privateIpAddress":"10.1.0.5"}]}},{"ipv4":{"ipAddress":[{"privateIpAddress":"10.2.0.4"}]}}]}`, "10.1.0.4", ""},
		{"no interface", `{"interface":[]}`, "", "no interface"},
		{"not an address", `{"interface":[{"ipv4":{"ipAddress":[{"privateIpAddress":"10.1.0"}]}}]}`, "", "not an IPv4 address"},
		{"IPv6 in the ipv4 list", `{"interface":[{"ipv4":{"ipAddress":[{"privateIpAddress":"fd00::4"}]}}]}`, "", "not an IPv4 address"},
		{"not JSON", `<html>`, "", "network answer"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseAzureNetwork([]byte(tt.body))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseAzureNetwork() = %v, %v, want an error saying %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got.String() != tt.want {
				t.Fatalf("parseAzureNetwork() = %v, %v, want %s", got, err, tt.want)
			}
		})
	}
}

// FuzzParseAzureToken feeds arbitrary IMDS answers to parseAzureToken: it
// refuses them or returns a bounded three-part token, never panics.
func FuzzParseAzureToken(f *testing.F) {
	f.Add([]byte(`{"access_token":"a.b.c","token_type":"Bearer","expires_in":"86399"}`))
	f.Add([]byte(`{"access_token":""}`))
	f.Add([]byte(`{"access_token":5}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tok, err := parseAzureToken(b)
		if err != nil {
			return
		}
		if tok == "" || len(tok) > maxAzureToken || strings.Count(tok, ".") != 2 || strings.TrimSpace(tok) != tok {
			t.Fatalf("accepted token %q from %q", tok, b)
		}
	})
}

// FuzzParseAzureNetwork feeds arbitrary IMDS answers to parseAzureNetwork:
// it refuses them or returns a valid IPv4 address, never panics.
func FuzzParseAzureNetwork(f *testing.F) {
	f.Add([]byte(`{"interface":[{"ipv4":{"ipAddress":[{"privateIpAddress":"10.1.0.4"}]}}]}`))
	f.Add([]byte(`{"interface":[{"ipv4":{"ipAddress":[]}}]}`))
	f.Add([]byte(`{"interface":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ip, err := parseAzureNetwork(b)
		if err != nil {
			return
		}
		if !ip.IsValid() || !ip.Is4() {
			t.Fatalf("accepted address %v from %q", ip, b)
		}
	})
}
