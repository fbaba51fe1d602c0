package aws_test

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/embark-mesh/embark/onboarding/identity"
	awsid "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/identity/aws/client"
)

const audience = "onboarding.example.com"

// stsFixture is one instance (account 123456789012, i-1234567890abcdef0,
// role ratings-role) with its IMDS, a signature-checking STS and a CA.
type stsFixture struct {
	env *awstest.Env
	// altSTSURL is another STS endpoint a test case set up.
	altSTSURL string
}

func newSTSFixture(t *testing.T) *stsFixture {
	t.Helper()
	return &stsFixture{env: awstest.Start(t, awstest.Instance{Role: "ratings-role"})}
}

func (f *stsFixture) verifier(t *testing.T, opts ...awsid.Option) *awsid.Verifier {
	t.Helper()
	base := []awsid.Option{
		awsid.WithTrustedCertificates(map[string]*x509.Certificate{"us-east-2": f.env.CA.Certificate}),
		awsid.WithSTSEndpoint(f.env.STS.URL),
	}
	v, err := awsid.NewVerifier(audience, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// credentialFrom gathers the credential of the instance behind m with the
// real SDK clients, the STS request signed for stsURL and aud.
func credentialFrom(t *testing.T, m *awstest.IMDS, stsURL, aud string) awsid.Credential {
	t.Helper()
	imdsClient := imds.New(imds.Options{Endpoint: m.URL})
	stsClient := client.NewSTSClient(imdsClient, m.Instance().Region, func(o *sts.Options) { o.BaseEndpoint = &stsURL })
	cred, err := client.Credential(t.Context(), imdsClient, stsClient, aud)
	if err != nil {
		t.Fatal(err)
	}
	return *cred
}

// signWith signs a GetCallerIdentity request with the given credentials
// through the real STS client.
func signWith(t *testing.T, c awstest.Credentials, stsURL string) *awsid.STSRequest {
	t.Helper()
	stsClient := sts.New(sts.Options{
		Region:       "us-east-2",
		BaseEndpoint: &stsURL,
		Credentials:  credentials.NewStaticCredentialsProvider(c.AccessKeyID, c.SecretAccessKey, c.SessionToken),
	})
	req, err := client.SignGetCallerIdentity(t.Context(), stsClient, audience)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// signWithoutAudience signs with the SDK's SigV4 signer a GetCallerIdentity
// request that has no audience header, then adds the header unsigned.
func signWithoutAudience(t *testing.T, c awstest.Credentials, stsURL string) *awsid.STSRequest {
	t.Helper()
	body := "Action=GetCallerIdentity&Version=2011-06-15"
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, stsURL+"/", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	sum := sha256.Sum256([]byte(body))
	creds := sdkaws.Credentials{AccessKeyID: c.AccessKeyID, SecretAccessKey: c.SecretAccessKey, SessionToken: c.SessionToken}
	if err := v4.NewSigner().SignHTTP(t.Context(), creds, req, hex.EncodeToString(sum[:]), "sts", "us-east-2", time.Now()); err != nil {
		t.Fatal(err)
	}
	req.Header.Set(awsid.AudienceHeader, audience)
	return &awsid.STSRequest{Method: req.Method, URL: req.URL.String(), Headers: req.Header, Body: []byte(body)}
}

func (f *stsFixture) roleCredentials(t *testing.T) awstest.Credentials {
	t.Helper()
	c, ok := f.env.IMDS.RoleCredentials()
	if !ok {
		t.Fatal("instance has no role credentials")
	}
	return c
}

func TestVerifySTS(t *testing.T) {
	tests := []struct {
		name string
		// credential builds what the instance presents.
		credential func(t *testing.T, f *stsFixture) awsid.Credential
		// opts adds verifier options; it runs before credential.
		opts func(t *testing.T, f *stsFixture) []awsid.Option
		// allowedRoles, if set, is checked with CheckIAMRole after Verify.
		allowedRoles []string
		wantReason   identity.Reason
		wantRole     string
		// wantNoSTSCall: the request must be refused before calling STS.
		wantNoSTSCall bool
	}{
		{
			name: "valid proof of the instance's role",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				return credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
			},
			allowedRoles: []string{"ratings-role"},
			wantRole:     "ratings-role",
		},
		{
			name: "STS answers for another account",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				other := f.env.AddInstance(t, nil, awstest.Instance{Account: "210987654321", Role: "ratings-role"})
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				cred.STS = credentialFrom(t, other, f.env.STS.URL, audience).STS
				return cred
			},
			wantReason: identity.ReasonAccountMismatch,
		},
		{
			name: "STS answers for another instance",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				other := f.env.AddInstance(t, nil, awstest.Instance{InstanceID: "i-0bbbbbbbbbbbbbbbb", Role: "ratings-role"})
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				cred.STS = credentialFrom(t, other, f.env.STS.URL, audience).STS
				return cred
			},
			wantReason: identity.ReasonInstanceMismatch,
		},
		{
			name: "STS answers with another role than the policy allows",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				other := f.env.AddInstance(t, nil, awstest.Instance{Role: "reviews-role"})
				return credentialFrom(t, other, f.env.STS.URL, audience)
			},
			allowedRoles: []string{"ratings-role"},
			wantReason:   identity.ReasonRoleMismatch,
		},
		{
			name: "STS answers for another partition",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				c := f.env.STS.Issue(awstest.Principal{ARN: awstest.AssumedRoleARN("aws-cn", "123456789012", "ratings-role", "i-1234567890abcdef0"), Account: "123456789012"}, time.Hour)
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				cred.STS = signWith(t, c, f.env.STS.URL)
				return cred
			},
			wantReason: identity.ReasonPartitionMismatch,
		},
		{
			name: "STS answers with an IAM user",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				c := f.env.STS.Issue(awstest.Principal{ARN: "arn:aws:iam::123456789012:user/alice", Account: "123456789012"}, time.Hour)
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				cred.STS = signWith(t, c, f.env.STS.URL)
				return cred
			},
			wantReason: identity.ReasonNotAssumedRole,
		},
		{
			name: "STS answers with an account field contradicting the ARN",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				c := f.env.STS.Issue(awstest.Principal{ARN: awstest.AssumedRoleARN("aws", "123456789012", "ratings-role", "i-1234567890abcdef0"), Account: "999999999999"}, time.Hour)
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				cred.STS = signWith(t, c, f.env.STS.URL)
				return cred
			},
			wantReason: identity.ReasonAccountMismatch,
		},
		{
			name: "no STS proof but the policy names roles",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				cred.STS = nil
				return cred
			},
			allowedRoles:  []string{"ratings-role"},
			wantReason:    identity.ReasonSTSProofRequired,
			wantNoSTSCall: true,
		},
		{
			name: "signed for another audience",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				return credentialFrom(t, f.env.IMDS, f.env.STS.URL, "evil.example.com")
			},
			wantReason:    identity.ReasonSTSUnbound,
			wantNoSTSCall: true,
		},
		{
			name: "audience header removed",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				cred.STS.Headers.Del(awsid.AudienceHeader)
				return cred
			},
			wantReason:    identity.ReasonSTSUnbound,
			wantNoSTSCall: true,
		},
		{
			name: "audience header present but not signed",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				cred.STS = signWithoutAudience(t, f.roleCredentials(t), f.env.STS.URL)
				return cred
			},
			wantReason:    identity.ReasonSTSUnbound,
			wantNoSTSCall: true,
		},
		{
			name: "audience rewritten after signing",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, "evil.example.com")
				cred.STS.Headers.Set(awsid.AudienceHeader, audience)
				return cred
			},
			wantReason: identity.ReasonSTSRejected,
		},
		{
			name: "signed more than 5 minutes ago",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				return credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
			},
			opts: func(*testing.T, *stsFixture) []awsid.Option {
				return []awsid.Option{shiftedClock(5*time.Minute + 30*time.Second)}
			},
			wantReason:    identity.ReasonSTSStale,
			wantNoSTSCall: true,
		},
		{
			name: "signed in the future beyond the clock skew",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				return credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
			},
			opts:          func(*testing.T, *stsFixture) []awsid.Option { return []awsid.Option{shiftedClock(-2 * time.Minute)} },
			wantReason:    identity.ReasonSTSStale,
			wantNoSTSCall: true,
		},
		{
			name: "signed 6 minutes ago with a 10 minute window",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				return credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
			},
			opts: func(*testing.T, *stsFixture) []awsid.Option {
				return []awsid.Option{shiftedClock(6 * time.Minute), awsid.WithSTSFreshness(10*time.Minute, time.Minute)}
			},
			wantRole: "ratings-role",
		},
		{
			name: "signature tampered",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				authz := cred.STS.Headers.Get("Authorization")
				last := authz[len(authz)-1]
				flipped := byte('0')
				if last == '0' {
					flipped = '1'
				}
				cred.STS.Headers.Set("Authorization", authz[:len(authz)-1]+string(flipped))
				return cred
			},
			wantReason: identity.ReasonSTSRejected,
		},
		{
			name: "signed with revoked credentials",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				f.env.STS.Revoke(f.roleCredentials(t).AccessKeyID)
				return cred
			},
			wantReason: identity.ReasonSTSRejected,
		},
		{
			name: "signed with expired credentials",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				c := f.env.STS.IssueRole("aws", "123456789012", "ratings-role", "i-1234567890abcdef0", -time.Minute)
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				cred.STS = signWith(t, c, f.env.STS.URL)
				return cred
			},
			wantReason: identity.ReasonSTSRejected,
		},
		{
			name: "signed for another STS endpoint than configured",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				return credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
			},
			opts: func(t *testing.T, f *stsFixture) []awsid.Option {
				other := awstest.NewSTS()
				t.Cleanup(other.Close)
				return []awsid.Option{awsid.WithSTSEndpoint(other.URL)}
			},
			wantReason:    identity.ReasonSTSRequestInvalid,
			wantNoSTSCall: true,
		},
		{
			name: "GET instead of POST",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				cred.STS.Method = http.MethodGet
				return cred
			},
			wantReason:    identity.ReasonSTSRequestInvalid,
			wantNoSTSCall: true,
		},
		{
			name: "another action",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				cred.STS.Body = []byte("Action=GetSessionToken&Version=2011-06-15")
				return cred
			},
			wantReason:    identity.ReasonSTSRequestInvalid,
			wantNoSTSCall: true,
		},
		{
			name: "extra parameter",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				cred.STS.Body = append(cred.STS.Body, "&RoleArn=x"...)
				return cred
			},
			wantReason:    identity.ReasonSTSRequestInvalid,
			wantNoSTSCall: true,
		},
		{
			name: "query string",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				cred.STS.URL += "?Action=AssumeRole"
				return cred
			},
			wantReason:    identity.ReasonSTSRequestInvalid,
			wantNoSTSCall: true,
		},
		{
			name: "no Authorization",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				cred.STS.Headers.Del("Authorization")
				return cred
			},
			wantReason:    identity.ReasonSTSRequestInvalid,
			wantNoSTSCall: true,
		},
		{
			name: "signed for another service",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				cred.STS.Headers.Set("Authorization", strings.Replace(cred.STS.Headers.Get("Authorization"), "/sts/aws4_request", "/iam/aws4_request", 1))
				return cred
			},
			wantReason:    identity.ReasonSTSRequestInvalid,
			wantNoSTSCall: true,
		},
		{
			name: "X-Amz-Date not in the credential scope's day",
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
				authz := cred.STS.Headers.Get("Authorization")
				date := cred.STS.Headers.Get("X-Amz-Date")[:8]
				cred.STS.Headers.Set("Authorization", strings.Replace(authz, "/"+date+"/", "/20000101/", 1))
				return cred
			},
			wantReason:    identity.ReasonSTSRequestInvalid,
			wantNoSTSCall: true,
		},
		{
			name: "STS unreachable",
			opts: func(t *testing.T, f *stsFixture) []awsid.Option {
				gone := awstest.NewSTS()
				f.altSTSURL = gone.URL
				gone.Close()
				return []awsid.Option{awsid.WithSTSEndpoint(f.altSTSURL)}
			},
			credential: func(t *testing.T, f *stsFixture) awsid.Credential {
				return credentialFrom(t, f.env.IMDS, f.altSTSURL, audience)
			},
			wantReason:    identity.ReasonSTSUnavailable,
			wantNoSTSCall: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newSTSFixture(t)
			var opts []awsid.Option
			if tt.opts != nil {
				opts = tt.opts(t, f)
			}
			cred := tt.credential(t, f)
			v := f.verifier(t, opts...)
			callsBefore := f.env.STS.Calls()
			id, err := v.Verify(t.Context(), cred)
			if err == nil && tt.allowedRoles != nil {
				err = id.CheckIAMRole(tt.allowedRoles)
			}
			if got := identity.ReasonOf(err); got != tt.wantReason {
				t.Fatalf("Verify() error = %v, want reason %q", err, tt.wantReason)
			}
			if tt.wantNoSTSCall && f.env.STS.Calls() != callsBefore {
				t.Errorf("the verifier called STS %d times for a request it must refuse beforehand", f.env.STS.Calls()-callsBefore)
			}
			if err != nil {
				t.Logf("refused: %v", err)
				return
			}
			a := id.AWS
			if !a.STSProven || a.IAMRole != tt.wantRole || id.Method != identity.MethodAWSInstanceIdentityDocumentAndSTS {
				t.Errorf("identity %+v (method %s), want STS-proven role %q", a, id.Method, tt.wantRole)
			}
			if want := awstest.AssumedRoleARN("aws", a.Account, a.IAMRole, a.InstanceID); a.CallerARN != want {
				t.Errorf("caller ARN %s, want %s", a.CallerARN, want)
			}
		})
	}
}

func shiftedClock(d time.Duration) awsid.Option {
	return awsid.WithClock(func() time.Time { return time.Now().Add(d) })
}

func TestSTSReplay(t *testing.T) {
	f := newSTSFixture(t)
	cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)

	tests := []struct {
		name       string
		verifier   *awsid.Verifier
		wantSecond identity.Reason
	}{
		{name: "replay refused", verifier: f.verifier(t), wantSecond: identity.ReasonSTSReplayed},
		{name: "replay cache disabled", verifier: f.verifier(t, awsid.WithReplayCacheSize(0))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := tt.verifier.Verify(t.Context(), cred); err != nil {
				t.Fatalf("first Verify() = %v", err)
			}
			_, err := tt.verifier.Verify(t.Context(), cred)
			if got := identity.ReasonOf(err); got != tt.wantSecond {
				t.Fatalf("second Verify() = %v, want reason %q", err, tt.wantSecond)
			}
		})
	}
}

// A request STS refused proved nothing: it is not remembered, so its
// second presentation is refused by STS again, not as a replay.
func TestSTSRefusalNotRememberedAsReplay(t *testing.T) {
	f := newSTSFixture(t)
	cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
	f.env.STS.Revoke(f.roleCredentials(t).AccessKeyID)
	v := f.verifier(t)
	for i := range 2 {
		_, err := v.Verify(t.Context(), cred)
		if !errors.Is(err, identity.ReasonSTSRejected) {
			t.Fatalf("attempt %d: Verify() = %v, want %s", i, err, identity.ReasonSTSRejected)
		}
	}
}

func TestSTSErrorAnswers(t *testing.T) {
	tests := []struct {
		name       string
		status     int
		body       string
		wantReason identity.Reason
		wantInMsg  string
	}{
		{name: "server error", status: 500, body: "<ErrorResponse><Error><Code>InternalFailure</Code><Message>oops</Message></Error></ErrorResponse>", wantReason: identity.ReasonSTSUnavailable, wantInMsg: "InternalFailure"},
		{name: "throttled", status: 429, body: "", wantReason: identity.ReasonSTSUnavailable},
		{name: "throttled as STS does (400 Throttling)", status: 400, body: "<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error></ErrorResponse>", wantReason: identity.ReasonSTSUnavailable, wantInMsg: "Throttling"},
		{name: "invalid client token", status: 403, body: "<ErrorResponse><Error><Code>InvalidClientTokenId</Code><Message>invalid</Message></Error></ErrorResponse>", wantReason: identity.ReasonSTSRejected, wantInMsg: "InvalidClientTokenId"},
		{name: "access denied", status: 403, body: "<ErrorResponse><Error><Code>AccessDenied</Code><Message>no</Message></Error></ErrorResponse>", wantReason: identity.ReasonSTSRejected, wantInMsg: "AccessDenied: no"},
		{name: "not XML", status: 200, body: "{}", wantReason: identity.ReasonSTSUnavailable},
		{name: "no ARN", status: 200, body: "<GetCallerIdentityResponse><GetCallerIdentityResult></GetCallerIdentityResult></GetCallerIdentityResponse>", wantReason: identity.ReasonSTSUnavailable},
		{name: "huge answer", status: 200, body: strings.Repeat("x", 70<<10), wantReason: identity.ReasonSTSUnavailable},
		{name: "redirect not followed", status: 302, body: "", wantReason: identity.ReasonSTSRejected},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newSTSFixture(t)
			broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.status == 302 {
					w.Header().Set("Location", f.env.STS.URL)
				}
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			}))
			t.Cleanup(broken.Close)
			cred := credentialFrom(t, f.env.IMDS, broken.URL, audience)
			v := f.verifier(t, awsid.WithSTSEndpoint(broken.URL))
			_, err := v.Verify(t.Context(), cred)
			if got := identity.ReasonOf(err); got != tt.wantReason {
				t.Fatalf("Verify() = %v, want reason %q", err, tt.wantReason)
			}
			if !strings.Contains(err.Error(), tt.wantInMsg) {
				t.Errorf("message %q does not contain %q", err, tt.wantInMsg)
			}
		})
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Without WithSTSEndpoint, the verifier sends a request to the regional STS
// endpoint the SDK resolves for the document's region, which is where an
// agent's STS client for that region signs it for. The transport here
// records where the request goes instead of leaving the machine.
func TestDefaultSTSEndpointIsRegional(t *testing.T) {
	tests := []struct {
		region   string
		wantHost string
	}{
		{region: "us-east-1", wantHost: "sts.us-east-1.amazonaws.com"},
		{region: "us-east-2", wantHost: "sts.us-east-2.amazonaws.com"},
		{region: "cn-north-1", wantHost: "sts.cn-north-1.amazonaws.com.cn"},
		{region: "us-gov-west-1", wantHost: "sts.us-gov-west-1.amazonaws.com"},
	}
	for _, tt := range tests {
		t.Run(tt.region, func(t *testing.T) {
			ca := newCA(t, tt.region)
			inst := awstest.Instance{Region: tt.region}
			doc := inst.Document()
			sig, err := ca.Sign(doc)
			if err != nil {
				t.Fatal(err)
			}
			// The agent's STS client with the SDK's default endpoint for the region.
			stsClient := sts.New(sts.Options{
				Region:      tt.region,
				Credentials: credentials.NewStaticCredentialsProvider("ASIAEXAMPLE", "secret", "token"),
			})
			req, err := client.SignGetCallerIdentity(t.Context(), stsClient, audience)
			if err != nil {
				t.Fatal(err)
			}
			if u, _ := url.Parse(req.URL); u.Host != tt.wantHost {
				t.Errorf("agent signed for %s, want %s", u.Host, tt.wantHost)
			}
			var sentTo string
			transport := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				sentTo = r.URL.Scheme + "://" + r.Host
				return &http.Response{StatusCode: 503, Body: io.NopCloser(bytes.NewReader(nil)), Header: http.Header{}, Request: r}, nil
			})
			v, err := awsid.NewVerifier(audience,
				awsid.WithTrustedCertificates(map[string]*x509.Certificate{tt.region: ca.Certificate}),
				awsid.WithHTTPClient(&http.Client{Transport: transport}))
			if err != nil {
				t.Fatal(err)
			}
			_, err = v.Verify(t.Context(), awsid.Credential{Document: doc, Signature: sig, STS: req})
			if !errors.Is(err, identity.ReasonSTSUnavailable) {
				t.Fatalf("Verify() = %v, want %s from the recording transport", err, identity.ReasonSTSUnavailable)
			}
			if want := "https://" + tt.wantHost; sentTo != want {
				t.Errorf("verifier sent the request to %q, want %q", sentTo, want)
			}
		})
	}
}
