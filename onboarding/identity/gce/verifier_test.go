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
	tests := []jwttest.Forgery[*fixture]{
		{
			Name: "wrong signer, Google's kid",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				return jwttest.Forged(t, f.google.KeyID(), c)
			},
			WantReason: identity.ReasonBadSignature, WantMsg: "does not verify",
		},
		{
			Name: "wrong audience",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["aud"] = "https://other.example.com"
				return f.sign(t, c)
			},
			WantReason: identity.ReasonWrongAudience, WantMsg: "audience",
		},
		{
			Name: "wrong issuer",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["iss"] = "accounts.google.com.evil.example"
				return f.sign(t, c)
			},
			WantReason: identity.ReasonUnknownIssuer, WantMsg: "issuer",
		},
		{
			Name: "expired",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["iat"], c["exp"] = f.now.Add(-3*time.Hour).Unix(), f.now.Add(-2*time.Hour).Unix()
				return f.sign(t, c)
			},
			WantReason: identity.ReasonExpired, WantMsg: "expired",
		},
		{
			Name: "issued in the future",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["iat"], c["exp"] = f.now.Add(10*time.Minute).Unix(), f.now.Add(70*time.Minute).Unix()
				return f.sign(t, c)
			},
			WantReason: identity.ReasonNotYetValid, WantMsg: "future",
		},
		{
			Name: "lifetime longer than an hour",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["exp"] = f.now.Add(24 * time.Hour).Unix()
				return f.sign(t, c)
			},
			WantReason: identity.ReasonLifetimeTooLong, WantMsg: "maxTokenLifetime",
		},
		{
			Name: "replayed",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				return jwttest.Used(t, f.v, f.sign(t, c))
			},
			WantReason: identity.ReasonReplayed, WantMsg: "already used",
		},
		{
			Name: "project edited after signing",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				tok := f.sign(t, c)
				ce := c["google"].(map[string]any)["compute_engine"].(map[string]any)
				ce["project_id"] = "victim-project"
				forged := f.sign(t, c)
				parts, forgedParts := strings.Split(tok, "."), strings.Split(forged, ".")
				return parts[0] + "." + forgedParts[1] + "." + parts[2]
			},
			WantReason: identity.ReasonBadSignature, WantMsg: "does not verify",
		},
		{
			Name: "format=standard: no compute_engine claims",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				delete(c, "google")
				return f.sign(t, c)
			},
			WantReason: identity.ReasonMalformed, WantMsg: "format=full",
		},
		{
			Name: "compute_engine without zone",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				delete(c["google"].(map[string]any)["compute_engine"].(map[string]any), "zone")
				return f.sign(t, c)
			},
			WantReason: identity.ReasonMalformed, WantMsg: "google.compute_engine.zone",
		},
		{
			Name: "instance name not a name",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["google"].(map[string]any)["compute_engine"].(map[string]any)["instance_name"] = "Bad/Name"
				return f.sign(t, c)
			},
			WantReason: identity.ReasonMalformed, WantMsg: "instance_name",
		},
		{
			Name: "no iat",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				delete(c, "iat")
				c["exp"] = f.now.Add(30 * time.Minute).Unix()
				return f.sign(t, c)
			},
			WantReason: identity.ReasonMalformed, WantMsg: "iat",
		},
		{
			Name: "service account email not verified",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["email_verified"] = false
				return f.sign(t, c)
			},
			WantReason: identity.ReasonMalformed, WantMsg: "email_verified",
		},
		{
			Name: "no service account",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				delete(c, "email")
				return f.sign(t, c)
			},
			WantReason: identity.ReasonMalformed, WantMsg: "service account",
		},
		{
			Name: "unsigned",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				return jwttest.Unsigned(f.sign(t, c))
			},
			WantReason: identity.ReasonDisallowedAlgorithm, WantMsg: "unsigned",
		},
	}
	jwttest.RefuseForgeries(t, tests, func(t *testing.T) (*fixture, jwttest.TokenVerifier, map[string]any) {
		f := newFixture(t)
		return f, f.v, in.Claims(audience, f.now.Add(-time.Minute))
	})
}

// TestEachTokenOnce: two tokens of one instance each onboard once.
func TestEachTokenOnce(t *testing.T) {
	f := newFixture(t)
	in := gcetest.DefaultInstance()
	jwttest.EachTokenOnce(t, f.v, f.sign(t, in.Claims(audience, f.now.Add(-time.Minute))), f.sign(t, in.Claims(audience, f.now.Add(-2*time.Minute))))
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
