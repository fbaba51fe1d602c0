package awstest_test

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/credentials/ec2rolecreds"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	"github.com/aws/smithy-go"
	"github.com/smallstep/pkcs7"

	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
)

func TestCASignsLikeAWS(t *testing.T) {
	ca, err := awstest.NewCA("us-east-2")
	if err != nil {
		t.Fatal(err)
	}
	doc := awstest.Instance{}.Document()
	tests := []struct {
		name      string
		opts      awstest.SignOptions
		wantCerts int
		wantDoc   bool
	}{
		{name: "as AWS: content enclosed, no certificates", wantCerts: 0, wantDoc: true},
		{name: "certificate enclosed", opts: awstest.SignOptions{EmbedCertificate: true}, wantCerts: 1, wantDoc: true},
		{name: "detached", opts: awstest.SignOptions{Detached: true}, wantCerts: 0, wantDoc: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			der, err := ca.SignDER(doc, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			p7, err := pkcs7.Parse(der)
			if err != nil {
				t.Fatal(err)
			}
			if len(p7.Certificates) != tt.wantCerts {
				t.Errorf("%d certificates enclosed, want %d", len(p7.Certificates), tt.wantCerts)
			}
			if got := bytes.Equal(p7.Content, doc); got != tt.wantDoc {
				t.Errorf("content is the document: %v, want %v", got, tt.wantDoc)
			}
			if len(p7.Signers) != 1 {
				t.Fatalf("%d signers", len(p7.Signers))
			}
			if !tt.wantDoc {
				p7.Content = doc
			}
			p7.Certificates = []*x509.Certificate{ca.Certificate}
			if err := p7.Verify(); err != nil {
				t.Errorf("signature does not verify with the CA certificate: %v", err)
			}
		})
	}
	sig, err := ca.Sign(doc)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(sig), "\n") {
		if len(line) > 76 {
			t.Errorf("base64 line of %d characters, IMDS wraps at 76", len(line))
		}
	}
	if _, err := base64.StdEncoding.DecodeString(strings.ReplaceAll(string(sig), "\n", "")); err != nil {
		t.Errorf("signature is not base64: %v", err)
	}
}

func TestInstanceDocumentLayout(t *testing.T) {
	doc := string(awstest.Instance{Account: "210987654321", Region: "eu-west-1", InstanceID: "i-0aaaaaaaaaaaaaaaa"}.Document())
	for _, want := range []string{`  "accountId" : "210987654321",`, `  "availabilityZone" : "eu-west-1b",`, `  "region" : "eu-west-1",`, `  "instanceId" : "i-0aaaaaaaaaaaaaaaa",`} {
		if !strings.Contains(doc, want) {
			t.Errorf("document lacks %q:\n%s", want, doc)
		}
	}
	if !strings.HasPrefix(doc, "{\n") || !strings.HasSuffix(doc, "\n}") {
		t.Errorf("document framing:\n%s", doc)
	}
}

func TestIMDSThroughSDK(t *testing.T) {
	env := awstest.Start(t, awstest.Instance{Role: "ratings-role"})
	c := imds.New(imds.Options{Endpoint: env.IMDS.URL})
	ctx := t.Context()

	iid, err := c.GetInstanceIdentityDocument(ctx, &imds.GetInstanceIdentityDocumentInput{})
	if err != nil {
		t.Fatal(err)
	}
	if iid.InstanceID != "i-1234567890abcdef0" || iid.AccountID != "123456789012" || iid.AvailabilityZone != "us-east-2b" || iid.Region != "us-east-2" {
		t.Errorf("document %+v", iid.InstanceIdentityDocument)
	}
	region, err := c.GetRegion(ctx, &imds.GetRegionInput{})
	if err != nil || region.Region != "us-east-2" {
		t.Errorf("GetRegion() = %v, %v", region, err)
	}
	for path, want := range map[string]string{"placement/availability-zone": "us-east-2b", "instance-id": "i-1234567890abcdef0", "local-ipv4": "172.31.5.254"} {
		out, err := c.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
		if err != nil {
			t.Fatalf("GetMetadata(%s): %v", path, err)
		}
		b, _ := io.ReadAll(out.Content)
		if string(b) != want {
			t.Errorf("%s = %q, want %q", path, b, want)
		}
	}
	info, err := c.GetIAMInfo(ctx, &imds.GetIAMInfoInput{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(info.InstanceProfileArn, ":instance-profile/ratings-role") {
		t.Errorf("instance profile %s", info.InstanceProfileArn)
	}
	creds, err := ec2rolecreds.New(func(o *ec2rolecreds.Options) { o.Client = c }).Retrieve(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := env.IMDS.RoleCredentials()
	if creds.AccessKeyID != want.AccessKeyID || creds.SessionToken != want.SessionToken || !creds.CanExpire {
		t.Errorf("role credentials %s, want %s", creds.AccessKeyID, want.AccessKeyID)
	}
}

func TestIMDSRefusesWhatEC2Refuses(t *testing.T) {
	env := awstest.Start(t, awstest.Instance{})
	tests := []struct {
		name       string
		method     string
		path       string
		header     map[string]string
		wantStatus int
	}{
		{name: "IMDSv1 GET without token", method: http.MethodGet, path: "/latest/dynamic/instance-identity/document", wantStatus: http.StatusUnauthorized},
		{name: "bogus token", method: http.MethodGet, path: "/latest/dynamic/instance-identity/document", header: map[string]string{"X-Aws-Ec2-Metadata-Token": "nope"}, wantStatus: http.StatusUnauthorized},
		{name: "token without TTL", method: http.MethodPut, path: "/latest/api/token", wantStatus: http.StatusBadRequest},
		{name: "token TTL too long", method: http.MethodPut, path: "/latest/api/token", header: map[string]string{"X-Aws-Ec2-Metadata-Token-Ttl-Seconds": "21601"}, wantStatus: http.StatusBadRequest},
		{name: "token by GET", method: http.MethodGet, path: "/latest/api/token", header: map[string]string{"X-Aws-Ec2-Metadata-Token-Ttl-Seconds": "60"}, wantStatus: http.StatusMethodNotAllowed},
		{name: "through a proxy", method: http.MethodPut, path: "/latest/api/token", header: map[string]string{"X-Aws-Ec2-Metadata-Token-Ttl-Seconds": "60", "X-Forwarded-For": "10.0.0.1"}, wantStatus: http.StatusForbidden},
		{name: "token", method: http.MethodPut, path: "/latest/api/token", header: map[string]string{"X-Aws-Ec2-Metadata-Token-Ttl-Seconds": "60"}, wantStatus: http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), tt.method, env.IMDS.URL+tt.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status %d, want %d", resp.StatusCode, tt.wantStatus)
			}
		})
	}
	// An instance without role has no credentials.
	c := imds.New(imds.Options{Endpoint: env.IMDS.URL})
	if _, err := ec2rolecreds.New(func(o *ec2rolecreds.Options) { o.Client = c }).Retrieve(t.Context()); err == nil {
		t.Error("role credentials served for an instance without role")
	}
}

func TestSTSThroughSDK(t *testing.T) {
	clockSkew := time.Duration(0)
	fake := awstest.NewSTS(awstest.WithSTSClock(func() time.Time { return time.Now().Add(clockSkew) }))
	t.Cleanup(fake.Close)
	good := fake.IssueRole("aws", "123456789012", "ratings-role", "i-1234567890abcdef0", time.Hour)
	expired := fake.IssueRole("aws", "123456789012", "ratings-role", "i-1234567890abcdef0", -time.Minute)
	revoked := fake.IssueRole("aws", "123456789012", "ratings-role", "i-1234567890abcdef0", time.Hour)
	fake.Revoke(revoked.AccessKeyID)

	tests := []struct {
		name     string
		creds    awstest.Credentials
		mutate   func(c *awstest.Credentials)
		skew     time.Duration
		wantCode string
	}{
		{name: "valid", creds: good},
		{name: "wrong secret", creds: good, mutate: func(c *awstest.Credentials) { c.SecretAccessKey += "x" }, wantCode: "SignatureDoesNotMatch"},
		{name: "wrong session token", creds: good, mutate: func(c *awstest.Credentials) { c.SessionToken += "x" }, wantCode: "InvalidClientTokenId"},
		{name: "unknown key", creds: good, mutate: func(c *awstest.Credentials) { c.AccessKeyID = "ASIAUNKNOWN" }, wantCode: "InvalidClientTokenId"},
		{name: "revoked", creds: revoked, wantCode: "InvalidClientTokenId"},
		{name: "expired credentials", creds: expired, wantCode: "ExpiredToken"},
		{name: "signature older than 15 minutes", creds: good, skew: 16 * time.Minute, wantCode: "SignatureDoesNotMatch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.creds
			if tt.mutate != nil {
				tt.mutate(&c)
			}
			clockSkew = tt.skew
			client := sts.New(sts.Options{
				Region:       "us-east-2",
				BaseEndpoint: &fake.URL,
				Credentials:  credentials.NewStaticCredentialsProvider(c.AccessKeyID, c.SecretAccessKey, c.SessionToken),
				Retryer:      sdkaws.NopRetryer{},
			})
			out, err := client.GetCallerIdentity(t.Context(), &sts.GetCallerIdentityInput{})
			if tt.wantCode == "" {
				if err != nil {
					t.Fatal(err)
				}
				if *out.Arn != "arn:aws:sts::123456789012:assumed-role/ratings-role/i-1234567890abcdef0" || *out.Account != "123456789012" {
					t.Errorf("caller %s in %s", *out.Arn, *out.Account)
				}
				if !strings.HasSuffix(*out.UserId, ":i-1234567890abcdef0") {
					t.Errorf("user ID %s", *out.UserId)
				}
				return
			}
			var apiErr smithy.APIError
			if !errors.As(err, &apiErr) || apiErr.ErrorCode() != tt.wantCode {
				t.Fatalf("GetCallerIdentity() = %v, want API error %s", err, tt.wantCode)
			}
		})
	}
}

func TestIMDSOptions(t *testing.T) {
	ca, err := awstest.NewCA("us-east-2")
	if err != nil {
		t.Fatal(err)
	}
	fake := awstest.NewSTS()
	t.Cleanup(fake.Close)
	forged := []byte("Zm9yZ2Vk")
	m, err := awstest.NewIMDS(ca, awstest.Instance{Role: "r"}, awstest.WithSignature(forged), awstest.WithRoleCredentialsFrom(fake), awstest.WithCredentialTTL(10*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	c := imds.New(imds.Options{Endpoint: m.URL})
	out, err := c.GetDynamicData(t.Context(), &imds.GetDynamicDataInput{Path: "instance-identity/rsa2048"})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(out.Content)
	if !bytes.Equal(got, forged) {
		t.Errorf("signature %q, want the configured %q", got, forged)
	}
	creds, ok := m.RoleCredentials()
	if !ok {
		t.Fatal("no role credentials")
	}
	if ttl := time.Until(creds.Expiration); ttl > 10*time.Minute || ttl < 8*time.Minute {
		t.Errorf("credentials expire in %s, want about 10m", ttl)
	}
}
