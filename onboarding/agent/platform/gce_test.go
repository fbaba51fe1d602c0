package platform

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/identity/gce"
	"github.com/embark-mesh/embark/onboarding/identity/gce/gcetest"
)

func TestDetectGCEAndCredential(t *testing.T) {
	google, err := gcetest.NewGoogle()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(google.Close)
	md := gcetest.NewMetadataServer(google, gcetest.DefaultInstance())
	t.Cleanup(md.Close)
	dead := httptest.NewServer(nil)
	deadURL := dead.URL
	dead.Close()

	var logs bytes.Buffer
	cfg := config.Host{Platform: config.PlatformAuto, AWS: config.AWSPlatform{IMDSEndpoint: deadURL}, GCE: config.GCEPlatform{MetadataEndpoint: md.URL()}}
	p, err := Detect(t.Context(), cfg, "onboarding.example", testLogger(&logs))
	if err != nil {
		t.Fatal(err)
	}
	if p.Name() != "gce" || !strings.Contains(logs.String(), "gce detected") || !strings.Contains(logs.String(), "us-central1-a") {
		t.Fatalf("detected %s, logs %s", p.Name(), logs.String())
	}
	cred, err := p.Credential(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if cred.GCE.GetToken() == "" || cred.Address == nil || cred.Address.IP != "10.128.0.7" || cred.Address.Type != "VPC" {
		t.Fatalf("credential %+v address %+v", cred.GCE, cred.Address)
	}
	// The token is the endpoint's to verify: Google-signed, for the
	// audience, with the compute_engine claims.
	v, err := gce.NewVerifier(gce.Config{Audiences: []string{"onboarding.example"}, JWKSURL: google.JWKSURL(), CACertificates: google.CACertificates()})
	if err != nil {
		t.Fatal(err)
	}
	id, err := v.Verify(t.Context(), cred.GCE.GetToken())
	if err != nil {
		t.Fatalf("the agent's token does not verify: %v", err)
	}
	if id.GCE.InstanceName != "ratings-1" {
		t.Errorf("instance %q", id.GCE.InstanceName)
	}
}

func TestGCERefusesAnImpostorMetadataServer(t *testing.T) {
	// A server that answers without Metadata-Flavor: Google is not the
	// metadata server (a proxy, a captive portal): its answer is not used.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("a.b.c")) }))
	t.Cleanup(srv.Close)
	p := NewGCE(config.GCEPlatform{MetadataEndpoint: srv.URL}, "aud", slog.New(slog.DiscardHandler))
	_, err := p.Credential(t.Context())
	if err == nil || !strings.Contains(err.Error(), "not a Compute Engine metadata server") {
		t.Fatalf("error %v", err)
	}
}

func TestConfiguredGCE(t *testing.T) {
	var logs bytes.Buffer
	p, err := Detect(t.Context(), config.Host{Platform: config.PlatformGCE}, "aud", testLogger(&logs))
	if err != nil {
		t.Fatal(err)
	}
	if p.Name() != "gce" || !strings.Contains(logs.String(), DefaultGCEMetadataEndpoint) {
		t.Errorf("platform %s, logs %s", p.Name(), logs.String())
	}
}
