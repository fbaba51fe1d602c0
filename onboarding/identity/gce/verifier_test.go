package gce_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/gce"
	"github.com/embark-mesh/embark/onboarding/identity/gce/gcetest"
	"github.com/embark-mesh/embark/onboarding/identity/jwt"
	"github.com/embark-mesh/embark/onboarding/identity/jwt/jwttest"
)

const audience = "onboarding.example.com"

// fixture is a loopback Google and a verifier trusting it, at a fixed time.
type fixture struct {
	google *gcetest.Google
	now    time.Time
	v      *gce.Verifier
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	g, err := gcetest.NewGoogle()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return newFixtureWith(t, g)
}

// newFixtureWith is a fresh verifier (empty replay cache) trusting g.
func newFixtureWith(t *testing.T, g *gcetest.Google) *fixture {
	t.Helper()
	f := &fixture{google: g, now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	var err error
	f.v, err = gce.NewVerifier(gce.Config{Audiences: []string{audience}, JWKSURL: g.JWKSURL(), CACertificates: g.CACertificates()},
		jwt.WithClock(func() time.Time { return f.now }))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) sign(t *testing.T, claims map[string]any) string {
	t.Helper()
	tok, err := f.google.Sign(claims)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestVerifyAcceptsGoogleToken(t *testing.T) {
	f := newFixture(t)
	in := gcetest.DefaultInstance()
	id, err := f.v.Verify(t.Context(), f.sign(t, in.Claims(audience, f.now.Add(-time.Minute))))
	if err != nil {
		t.Fatal(err)
	}
	want := identity.GCEIdentity{
		ProjectID: "embark-test", ProjectNumber: "123456789012", Zone: "us-central1-a",
		InstanceID: "5180367924151823417", InstanceName: "ratings-1",
		InstanceCreation: f.now.Add(-61 * time.Minute), ServiceAccount: "ratings@embark-test.iam.gserviceaccount.com",
		Expiry: f.now.Add(59 * time.Minute),
	}
	if id.Method != identity.MethodGCEInstanceIdentityToken || id.GCE == nil || *id.GCE != want {
		t.Fatalf("identity %+v (%s), want %+v", id.GCE, id.Method, want)
	}
	if id.AWS != nil || id.JWT != nil {
		t.Error("identity sets another platform too")
	}
}

// TestVerifyRefusesForgeries is the forgery table: every token is refused
// with the reason named.
func TestVerifyRefusesForgeries(t *testing.T) {
	in := gcetest.DefaultInstance()
	otherKey, err := jwttest.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		// token builds the token from valid claims.
		token      func(t *testing.T, f *fixture, claims map[string]any) string
		wantReason identity.Reason
		wantMsg    string
	}{
		{
			name: "wrong signer, Google's kid",
			token: func(t *testing.T, f *fixture, c map[string]any) string {
				tok, err := jwttest.SignWith(otherKey, f.google.KeyID(), c)
				if err != nil {
					t.Fatal(err)
				}
				return tok
			},
			wantReason: identity.ReasonBadSignature, wantMsg: "does not verify",
		},
		{
			name: "wrong audience",
			token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["aud"] = "https://other.example.com"
				return f.sign(t, c)
			},
			wantReason: identity.ReasonWrongAudience, wantMsg: "audience",
		},
		{
			name: "wrong issuer",
			token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["iss"] = "accounts.google.com.evil.example"
				return f.sign(t, c)
			},
			wantReason: identity.ReasonUnknownIssuer, wantMsg: "issuer",
		},
		{
			name: "expired",
			token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["iat"], c["exp"] = f.now.Add(-3*time.Hour).Unix(), f.now.Add(-2*time.Hour).Unix()
				return f.sign(t, c)
			},
			wantReason: identity.ReasonExpired, wantMsg: "expired",
		},
		{
			name: "issued in the future",
			token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["iat"], c["exp"] = f.now.Add(10*time.Minute).Unix(), f.now.Add(70*time.Minute).Unix()
				return f.sign(t, c)
			},
			wantReason: identity.ReasonNotYetValid, wantMsg: "future",
		},
		{
			name: "lifetime longer than an hour",
			token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["exp"] = f.now.Add(24 * time.Hour).Unix()
				return f.sign(t, c)
			},
			wantReason: identity.ReasonLifetimeTooLong, wantMsg: "maxTokenLifetime",
		},
		{
			name: "replayed",
			token: func(t *testing.T, f *fixture, c map[string]any) string {
				tok := f.sign(t, c)
				if _, err := f.v.Verify(t.Context(), tok); err != nil {
					t.Fatalf("first use: %v", err)
				}
				return tok
			},
			wantReason: identity.ReasonReplayed, wantMsg: "already used",
		},
		{
			name: "project edited after signing",
			token: func(t *testing.T, f *fixture, c map[string]any) string {
				tok := f.sign(t, c)
				ce := c["google"].(map[string]any)["compute_engine"].(map[string]any)
				ce["project_id"] = "victim-project"
				forged := f.sign(t, c)
				parts, forgedParts := strings.Split(tok, "."), strings.Split(forged, ".")
				return parts[0] + "." + forgedParts[1] + "." + parts[2]
			},
			wantReason: identity.ReasonBadSignature, wantMsg: "does not verify",
		},
		{
			name: "format=standard: no compute_engine claims",
			token: func(t *testing.T, f *fixture, c map[string]any) string {
				delete(c, "google")
				return f.sign(t, c)
			},
			wantReason: identity.ReasonMalformed, wantMsg: "format=full",
		},
		{
			name: "compute_engine without zone",
			token: func(t *testing.T, f *fixture, c map[string]any) string {
				delete(c["google"].(map[string]any)["compute_engine"].(map[string]any), "zone")
				return f.sign(t, c)
			},
			wantReason: identity.ReasonMalformed, wantMsg: "google.compute_engine.zone",
		},
		{
			name: "instance name not a name",
			token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["google"].(map[string]any)["compute_engine"].(map[string]any)["instance_name"] = "Bad/Name"
				return f.sign(t, c)
			},
			wantReason: identity.ReasonMalformed, wantMsg: "instance_name",
		},
		{
			name: "no iat",
			token: func(t *testing.T, f *fixture, c map[string]any) string {
				delete(c, "iat")
				c["exp"] = f.now.Add(30 * time.Minute).Unix()
				return f.sign(t, c)
			},
			wantReason: identity.ReasonMalformed, wantMsg: "iat",
		},
		{
			name: "service account email not verified",
			token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["email_verified"] = false
				return f.sign(t, c)
			},
			wantReason: identity.ReasonMalformed, wantMsg: "email_verified",
		},
		{
			name: "no service account",
			token: func(t *testing.T, f *fixture, c map[string]any) string {
				delete(c, "email")
				return f.sign(t, c)
			},
			wantReason: identity.ReasonMalformed, wantMsg: "service account",
		},
		{
			name: "unsigned",
			token: func(t *testing.T, f *fixture, c map[string]any) string {
				parts := strings.Split(f.sign(t, c), ".")
				return "eyJhbGciOiJub25lIn0." + parts[1] + "."
			},
			wantReason: identity.ReasonDisallowedAlgorithm, wantMsg: "unsigned",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			tok := tt.token(t, f, in.Claims(audience, f.now.Add(-time.Minute)))
			id, err := f.v.Verify(t.Context(), tok)
			if err == nil {
				t.Fatalf("accepted: %+v", id.GCE)
			}
			if !errors.Is(err, tt.wantReason) {
				t.Errorf("reason %q, want %q (%v)", identity.ReasonOf(err), tt.wantReason, err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not say %q", err, tt.wantMsg)
			}
		})
	}
}

// TestEachTokenOnce: two tokens of one instance each onboard once.
func TestEachTokenOnce(t *testing.T) {
	f := newFixture(t)
	in := gcetest.DefaultInstance()
	first := f.sign(t, in.Claims(audience, f.now.Add(-time.Minute)))
	second := f.sign(t, in.Claims(audience, f.now.Add(-2*time.Minute)))
	for i, tok := range []string{first, second} {
		if _, err := f.v.Verify(t.Context(), tok); err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
	}
	if _, err := f.v.Verify(t.Context(), second); !errors.Is(err, identity.ReasonReplayed) {
		t.Fatalf("second token again: %v, want Replayed", err)
	}
}

func TestMetadataServerIssuesFullTokens(t *testing.T) {
	f := newFixture(t)
	f.now = time.Now()
	md := gcetest.NewMetadataServer(f.google, gcetest.DefaultInstance())
	t.Cleanup(md.Close)
	get := func(flavor, query string) (int, string) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, md.URL()+"/computeMetadata/v1/instance/service-accounts/default/identity"+query, nil)
		if err != nil {
			t.Fatal(err)
		}
		if flavor != "" {
			req.Header.Set("Metadata-Flavor", flavor)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var b strings.Builder
		_, _ = io.Copy(&b, io.LimitReader(resp.Body, 1<<16))
		return resp.StatusCode, b.String()
	}
	if code, _ := get("", "?audience="+audience+"&format=full"); code != http.StatusForbidden {
		t.Errorf("without Metadata-Flavor: %d, want 403", code)
	}
	code, tok := get("Google", "?audience="+audience+"&format=full")
	if code != http.StatusOK {
		t.Fatalf("identity: %d %s", code, tok)
	}
	if _, err := f.v.Verify(t.Context(), tok); err != nil {
		t.Fatalf("metadata server's token: %v", err)
	}
	_, std := get("Google", "?audience="+audience)
	if _, err := f.v.Verify(t.Context(), std); !errors.Is(err, identity.ReasonMalformed) {
		t.Fatalf("format=standard token: %v, want Malformed", err)
	}
}
