package platform

import (
	"bytes"
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
)

const sampleJWT = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ2bS0xIn0.c2ln"

func testLogger(buf *bytes.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func TestDetectAWSAndCredential(t *testing.T) {
	env := awstest.Start(t, awstest.Instance{Role: "ratings-role", PrivateIP: "172.31.5.9"})
	var logs bytes.Buffer
	cfg := config.Host{Platform: config.PlatformAuto, AWS: config.AWSPlatform{IMDSEndpoint: env.IMDS.URL, STSEndpoint: env.STS.URL}}
	p, err := Detect(t.Context(), cfg, "onboarding.example", testLogger(&logs))
	if err != nil {
		t.Fatal(err)
	}
	if p.Name() != "aws" {
		t.Fatalf("detected %s", p.Name())
	}
	if !strings.Contains(logs.String(), "aws EC2 detected") || !strings.Contains(logs.String(), env.IMDS.Instance().Region) {
		t.Errorf("detection not logged clearly: %s", logs.String())
	}
	cred, err := p.Credential(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(cred.AWS.GetInstanceIdentityDocument(), env.IMDS.Document()) || cred.AWS.GetRsa2048Signature() != string(env.IMDS.Signature()) {
		t.Error("document or signature differ from what IMDS served")
	}
	stsReq := cred.AWS.GetStsGetCallerIdentity()
	if stsReq == nil || !strings.HasPrefix(stsReq.GetUrl(), env.STS.URL) {
		t.Fatalf("STS proof %v, want one addressed to %s", stsReq, env.STS.URL)
	}
	var audience string
	for _, h := range stsReq.GetHeaders() {
		if strings.EqualFold(h.GetName(), awswire.AudienceHeader) {
			audience = h.GetValue()
		}
	}
	if audience != "onboarding.example" {
		t.Errorf("STS proof audience %q", audience)
	}
	if cred.Address == nil || cred.Address.IP != "172.31.5.9" {
		t.Errorf("address %+v, want the document's private IP", cred.Address)
	}
	if env.IMDS.Gets("/latest/dynamic/instance-identity/document") == 0 {
		t.Error("IMDS document not read")
	}
}

func TestAWSWithoutRoleSendsNoSTSProof(t *testing.T) {
	env := awstest.Start(t, awstest.Instance{})
	p := NewAWS(config.AWSPlatform{IMDSEndpoint: env.IMDS.URL, STSEndpoint: env.STS.URL}, "aud", slog.New(slog.DiscardHandler))
	cred, err := p.Credential(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if cred.AWS.GetStsGetCallerIdentity() != nil {
		t.Error("STS proof sent for an instance without a role")
	}
}

func TestDetectFallsBackToJWT(t *testing.T) {
	dead := httptest.NewServer(nil)
	deadURL := dead.URL
	dead.Close()
	file := filepath.Join(t.TempDir(), "jwt")
	if err := os.WriteFile(file, []byte(sampleJWT+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	p, err := Detect(t.Context(), config.Host{Platform: config.PlatformAuto, AWS: config.AWSPlatform{IMDSEndpoint: deadURL}, GCE: config.GCEPlatform{MetadataEndpoint: deadURL}, Azure: config.AzurePlatform{IMDSEndpoint: deadURL}, JWT: config.JWTPlatform{TokenFile: file}}, "aud", testLogger(&logs))
	if err != nil {
		t.Fatal(err)
	}
	if p.Name() != "jwt" || !strings.Contains(logs.String(), "IMDS did not answer") {
		t.Errorf("detected %s, logs %s", p.Name(), logs.String())
	}
	cred, err := p.Credential(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if cred.JWT.GetToken() != sampleJWT {
		t.Errorf("token %q", cred.JWT.GetToken())
	}
	_, err = Detect(t.Context(), config.Host{Platform: config.PlatformAuto, AWS: config.AWSPlatform{IMDSEndpoint: deadURL}, GCE: config.GCEPlatform{MetadataEndpoint: deadURL}, Azure: config.AzurePlatform{IMDSEndpoint: deadURL}}, "aud", testLogger(&logs))
	if err == nil || !strings.Contains(err.Error(), "no platform detected") || !strings.Contains(err.Error(), "Azure Instance Metadata Service") {
		t.Errorf("error %v, want no platform detected", err)
	}
}

func TestJWTSources(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o700); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name    string
		cfg     config.JWTPlatform
		want    string
		wantErr string
	}{
		{name: "file", cfg: config.JWTPlatform{TokenFile: write("ok", sampleJWT)}, want: sampleJWT},
		{name: "missing file", cfg: config.JWTPlatform{TokenFile: filepath.Join(dir, "none")}, wantErr: "read token file"},
		{name: "empty file", cfg: config.JWTPlatform{TokenFile: write("empty", "\n")}, wantErr: "produced no token"},
		{name: "not a JWT", cfg: config.JWTPlatform{TokenFile: write("junk", "hello world")}, wantErr: "not a compact JWT"},
		{name: "plugin", cfg: config.JWTPlatform{Command: []string{"/bin/sh", "-c", "echo " + sampleJWT}}, want: sampleJWT},
		{name: "failing plugin", cfg: config.JWTPlatform{Command: []string{"/bin/sh", "-c", "echo denied >&2; exit 3"}}, wantErr: "stderr: denied"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewJWT(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			cred, err := p.Credential(context.Background())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cred.JWT.GetToken() != tt.want {
				t.Errorf("token %q", cred.JWT.GetToken())
			}
		})
	}
}

func TestLocalAddress(t *testing.T) {
	ip, err := LocalAddress("127.0.0.1:15443")
	if err != nil {
		t.Fatal(err)
	}
	if ip != "127.0.0.1" {
		t.Errorf("local address %s", ip)
	}
}
