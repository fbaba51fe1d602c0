package client_test

import (
	"bytes"
	"crypto/x509"
	"net/http"
	"net/url"
	"strings"
	"testing"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	awsid "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
	"github.com/embark-mesh/embark/onboarding/identity/aws/client"
)

func TestFetchInstanceIdentity(t *testing.T) {
	env := awstest.Start(t, awstest.Instance{Role: "ratings-role"})
	c := imds.New(imds.Options{Endpoint: env.IMDS.URL})
	doc, sig, err := client.FetchInstanceIdentity(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(doc, env.IMDS.Document()) {
		t.Errorf("document differs from the one served:\n%s", doc)
	}
	if !bytes.Equal(sig, env.IMDS.Signature()) {
		t.Errorf("signature differs from the one served")
	}
	for _, p := range []string{"/latest/dynamic/instance-identity/document", "/latest/dynamic/instance-identity/rsa2048"} {
		if env.IMDS.Gets(p) != 1 {
			t.Errorf("IMDS served %s %d times, want 1", p, env.IMDS.Gets(p))
		}
	}
}

func TestFetchInstanceIdentityErrors(t *testing.T) {
	tests := []struct {
		name     string
		endpoint func(env *awstest.Env) string
	}{
		{name: "no IMDS listening", endpoint: func(*awstest.Env) string { return "http://127.0.0.1:1" }},
		{name: "not an IMDS", endpoint: func(env *awstest.Env) string { return env.STS.URL }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := awstest.Start(t, awstest.Instance{})
			c := imds.New(imds.Options{Endpoint: tt.endpoint(env), Retryer: sdkaws.NopRetryer{}})
			if _, _, err := client.FetchInstanceIdentity(t.Context(), c); err == nil {
				t.Fatal("FetchInstanceIdentity succeeded")
			}
		})
	}
}

func TestSignGetCallerIdentity(t *testing.T) {
	const audience = "onboarding.example.com"
	env := awstest.Start(t, awstest.Instance{Role: "ratings-role"})
	imdsClient := imds.New(imds.Options{Endpoint: env.IMDS.URL})
	stsClient := client.NewSTSClient(imdsClient, "us-east-2", func(o *sts.Options) { o.BaseEndpoint = &env.STS.URL })

	req, err := client.SignGetCallerIdentity(t.Context(), stsClient, audience)
	if err != nil {
		t.Fatal(err)
	}
	if env.STS.Calls() != 0 {
		t.Fatalf("signing sent %d requests to STS, want none", env.STS.Calls())
	}
	if req.Method != http.MethodPost {
		t.Errorf("method %s", req.Method)
	}
	u, err := url.Parse(req.URL)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := url.Parse(env.STS.URL); u.Host != want.Host {
		t.Errorf("signed for host %s, want %s", u.Host, want.Host)
	}
	if got := req.Headers.Get(awswire.AudienceHeader); got != audience {
		t.Errorf("audience header %q, want %q", got, audience)
	}
	authz := req.Headers.Get("Authorization")
	t.Logf("Authorization: %s", authz)
	if !strings.Contains(authz, "x-embark-onboarding-audience") || !strings.Contains(authz, "/us-east-2/sts/aws4_request") {
		t.Errorf("Authorization %q does not sign the audience for sts in us-east-2", authz)
	}
	creds, _ := env.IMDS.RoleCredentials()
	if !strings.Contains(authz, "Credential="+creds.AccessKeyID+"/") {
		t.Errorf("Authorization %q is not made with the instance's role credentials %s", authz, creds.AccessKeyID)
	}
	if string(req.Body) != "Action=GetCallerIdentity&Version=2011-06-15" {
		t.Errorf("body %q", req.Body)
	}

	// The captured request, sent as is, is accepted by the signature-checking
	// fake STS and proves the instance's role session.
	hreq, err := http.NewRequestWithContext(t.Context(), req.Method, req.URL, bytes.NewReader(req.Body))
	if err != nil {
		t.Fatal(err)
	}
	hreq.Header = req.Headers.Clone()
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("fake STS answered %d to the captured request", resp.StatusCode)
	}
}

func TestSignGetCallerIdentityErrors(t *testing.T) {
	env := awstest.Start(t, awstest.Instance{}) // no role: IMDS has no credentials
	imdsClient := imds.New(imds.Options{Endpoint: env.IMDS.URL})
	stsClient := client.NewSTSClient(imdsClient, "us-east-2", func(o *sts.Options) { o.BaseEndpoint = &env.STS.URL })
	tests := []struct {
		name     string
		audience string
		wantErr  string
	}{
		{name: "empty audience", audience: "", wantErr: "audience must not be empty"},
		{name: "instance without role", audience: "a", wantErr: "sign sts:GetCallerIdentity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := client.SignGetCallerIdentity(t.Context(), stsClient, tt.audience)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestCredentialVerifies(t *testing.T) {
	const audience = "onboarding.example.com"
	tests := []struct {
		name     string
		withSTS  bool
		wantRole string
	}{
		{name: "document only", withSTS: false},
		{name: "document and STS proof", withSTS: true, wantRole: "ratings-role"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := awstest.Start(t, awstest.Instance{Role: "ratings-role"})
			imdsClient := imds.New(imds.Options{Endpoint: env.IMDS.URL})
			var stsClient client.CallerIdentityAPI
			if tt.withSTS {
				stsClient = client.NewSTSClient(imdsClient, "us-east-2", func(o *sts.Options) { o.BaseEndpoint = &env.STS.URL })
			}
			cred, err := client.Credential(t.Context(), imdsClient, stsClient, audience)
			if err != nil {
				t.Fatal(err)
			}
			v, err := awsid.NewVerifier(audience,
				awsid.WithTrustedCertificates(map[string]*x509.Certificate{"us-east-2": env.CA.Certificate}),
				awsid.WithSTSEndpoint(env.STS.URL))
			if err != nil {
				t.Fatal(err)
			}
			id, err := v.Verify(t.Context(), *cred)
			if err != nil {
				t.Fatal(err)
			}
			if id.AWS.IAMRole != tt.wantRole || id.AWS.STSProven != tt.withSTS {
				t.Errorf("role %q proven %v, want %q %v", id.AWS.IAMRole, id.AWS.STSProven, tt.wantRole, tt.withSTS)
			}
			if a := id.AWS; a.Partition != "aws" || a.Account != "123456789012" || a.Zone != "us-east-2b" || a.InstanceID != "i-1234567890abcdef0" {
				t.Errorf("identity %+v, want the instance's partition, account, zone and ID", a)
			}
		})
	}
}
