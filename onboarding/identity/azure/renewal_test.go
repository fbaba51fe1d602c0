package azure_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/azure"
	"github.com/embark-mesh/embark/onboarding/identity/azure/azuretest"
	"github.com/embark-mesh/embark/onboarding/identity/jwt"
	"github.com/embark-mesh/embark/onboarding/identity/replay/replaytest"
)

// VerifyRenewal asks its renewal check only about a token already used and
// valid otherwise, with the identity the token proves; the token is accepted
// again only when the check accepts it.
func TestVerifyRenewal(t *testing.T) {
	vm := azuretest.DefaultVM()
	refuse := errors.New("not this session's")
	for _, tt := range []struct {
		name string
		// used says whether the token was accepted once before.
		used bool
		// edit changes the token's valid claims.
		edit       func(c map[string]any)
		renewal    error
		wantAsked  bool
		wantReason identity.Reason
		wantMsg    string
	}{
		{name: "fresh token: not asked", renewal: refuse},
		{name: "used token, renewal accepted", used: true, wantAsked: true},
		{name: "used token, renewal refused", used: true, renewal: refuse, wantAsked: true,
			wantReason: identity.ReasonReplayed, wantMsg: "not this VM's renewal: not this session's"},
		{name: "expired token: not asked", edit: func(c map[string]any) {
			c["exp"] = time.Date(2026, 5, 1, 11, 0, 0, 0, time.UTC).Unix()
			c["iat"], c["nbf"] = c["exp"].(int64)-3600, c["exp"].(int64)-3600
		}, wantReason: identity.ReasonExpired},
		{name: "token of another audience: not asked", edit: func(c map[string]any) {
			c["aud"] = "https://management.azure.com/"
		}, wantReason: identity.ReasonWrongAudience},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			c := vm.Claims(audience, f.now.Add(-time.Minute))
			tok := f.sign(t, c)
			if tt.used {
				if _, err := f.v.Verify(t.Context(), tok); err != nil {
					t.Fatalf("first use: %v", err)
				}
			}
			if tt.edit != nil {
				tt.edit(c)
				tok = f.sign(t, c)
			}
			var asked *identity.Identity
			id, err := f.v.VerifyRenewal(t.Context(), tok, func(id *identity.Identity) error {
				asked = id
				return tt.renewal
			})
			if (asked != nil) != tt.wantAsked {
				t.Fatalf("renewal asked: %v, want %v", asked != nil, tt.wantAsked)
			}
			if asked != nil && (asked.Azure.VMName != vm.Name || asked.Azure.PrincipalID != vm.PrincipalID || asked.Azure.SubscriptionID != vm.SubscriptionID) {
				t.Errorf("renewal asked about %+v, want VM %s", asked.Azure, vm.Name)
			}
			if tt.wantReason == "" {
				if err != nil || id == nil || id.Azure.VMName != vm.Name {
					t.Fatalf("VerifyRenewal() = %v, %v; want VM %s", id, err, vm.Name)
				}
				return
			}
			if identity.ReasonOf(err) != tt.wantReason || !strings.Contains(err.Error(), tt.wantMsg) || id != nil {
				t.Fatalf("VerifyRenewal() = %v, %v; want %s saying %q", id, err, tt.wantReason, tt.wantMsg)
			}
		})
	}
}

// Verify (no renewal check) never accepts a token twice, and a token
// accepted as a renewal stays used at every replica.
func TestRenewalAcceptsNothingTwiceWithoutCheck(t *testing.T) {
	m, err := azuretest.NewMicrosoft()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	shared := replaytest.NewShared(false)
	newVerifier := func() *azure.Verifier {
		v, err := azure.NewVerifier(azure.Config{Tenants: []string{azuretest.DefaultVM().TenantID}, Audiences: []string{audience}, JWKSURL: m.JWKSURL(), CACertificates: m.CACertificates()},
			jwt.WithClock(func() time.Time { return now }), jwt.WithSharedReplay(shared))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	a, b := newVerifier(), newVerifier()
	tok, err := m.Token(azuretest.DefaultVM(), audience, now.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	accept := func(*identity.Identity) error { return nil }
	if _, err := a.Verify(t.Context(), tok); err != nil {
		t.Fatalf("first use: %v", err)
	}
	if _, err := b.VerifyRenewal(t.Context(), tok, accept); err != nil {
		t.Fatalf("renewal at the other replica: %v", err)
	}
	for name, v := range map[string]*azure.Verifier{"first replica": a, "other replica": b} {
		if _, err := v.Verify(t.Context(), tok); identity.ReasonOf(err) != identity.ReasonReplayed {
			t.Errorf("%s: Verify() after the renewal = %v, want %s", name, err, identity.ReasonReplayed)
		}
		if _, err := v.VerifyRenewal(t.Context(), tok, nil); identity.ReasonOf(err) != identity.ReasonReplayed {
			t.Errorf("%s: VerifyRenewal(nil) = %v, want %s", name, err, identity.ReasonReplayed)
		}
	}
}

// A caching metadata service hands out its token again until the token is
// within CacheRefreshBefore of expiry, then a new one; the plain one issues
// a new token for every request.
func TestCachingIMDSHandsOutItsToken(t *testing.T) {
	m, err := azuretest.NewMicrosoft()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	caching, plain := azuretest.NewCachingIMDS(m, azuretest.DefaultVM()), azuretest.NewIMDS(m, azuretest.DefaultVM())
	t.Cleanup(caching.Close)
	t.Cleanup(plain.Close)
	for _, s := range []*azuretest.IMDS{caching, plain} {
		s.SetClock(func() time.Time { return now })
	}
	get := func(s *azuretest.IMDS) string {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, s.URL()+"/metadata/identity/oauth2/token?api-version=2018-02-01&resource="+audience, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Metadata", "true")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var out struct {
			AccessToken string `json:"access_token"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.AccessToken == "" {
			t.Fatalf("token answer: %v (%d)", err, resp.StatusCode)
		}
		return out.AccessToken
	}
	first := get(caching)
	now = now.Add(48 * time.Minute)
	if again := get(caching); again != first {
		t.Error("48 minutes later the caching service issued a new token, want its cached one")
	}
	now = now.Add(24*time.Hour - azuretest.CacheRefreshBefore - 48*time.Minute)
	if renewed := get(caching); renewed == first {
		t.Error("near expiry the caching service handed out its cached token, want a new one")
	}
	if caching.Issued() != 2 || caching.Served() != 3 {
		t.Errorf("caching service issued %d tokens for %d requests, want 2 for 3", caching.Issued(), caching.Served())
	}
	if one, two := get(plain), get(plain); one == two {
		t.Error("the plain service handed out one token twice")
	}
}
