package jwt_test

import (
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	josejwt "github.com/go-jose/go-jose/v4/jwt"

	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/jwt"
)

// oidcServer is an OIDC issuer on loopback TLS: a discovery document naming
// its own URL as issuer (or another, to test the check) and a JWKS.
type oidcServer struct {
	*httptest.Server
	issuer    atomic.Value // string, the issuer the document names
	jwksURI   atomic.Value // string
	discovery atomic.Int64
}

func newOIDCServer(t *testing.T, keys []byte) *oidcServer {
	t.Helper()
	s := &oidcServer{}
	mux := http.NewServeMux()
	mux.HandleFunc("/.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		s.discovery.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"issuer": s.issuer.Load(), "jwks_uri": s.jwksURI.Load(),
			"response_types_supported": []string{"id_token"}, "subject_types_supported": []string{"public"},
			"id_token_signing_alg_values_supported": []string{"RS256"},
		})
	})
	mux.HandleFunc("/openid/v1/jwks", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/jwk-set+json")
		_, _ = w.Write(keys)
	})
	s.Server = httptest.NewTLSServer(mux)
	t.Cleanup(s.Close)
	s.issuer.Store(s.URL)
	s.jwksURI.Store(s.URL + "/openid/v1/jwks")
	return s
}

func (s *oidcServer) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})
}

func TestOIDCDiscovery(t *testing.T) {
	k := testKeys(t)
	clock := newFakeClock()
	tests := []struct {
		name       string
		setup      func(s *oidcServer)
		noCA       bool
		wantReason identity.Reason
	}{
		{name: "discovered JWKS verifies the token"},
		{name: "the document names another issuer", setup: func(s *oidcServer) { s.issuer.Store("https://evil.example.com") }, wantReason: identity.ReasonKeySetUnavailable},
		{name: "jwks_uri not https", setup: func(s *oidcServer) { s.jwksURI.Store("http://127.0.0.1/keys") }, wantReason: identity.ReasonKeySetUnavailable},
		{name: "issuer's certificate not trusted", noCA: true, wantReason: identity.ReasonKeySetUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newOIDCServer(t, jwks(t, k.rsa))
			if tt.setup != nil {
				tt.setup(s)
			}
			cfg := jwt.IssuerConfig{Issuer: s.URL, ShortName: "corp", Audiences: []string{testAudience}}
			if !tt.noCA {
				cfg.CACertificates = s.caPEM()
			}
			v, err := jwt.NewVerifier([]jwt.IssuerConfig{cfg}, jwt.WithClock(clock.Now))
			if err != nil {
				t.Fatal(err)
			}
			claims := josejwt.Claims{Issuer: s.URL, Subject: "vm-01.example.com", Audience: josejwt.Audience{testAudience},
				IssuedAt: josejwt.NewNumericDate(clock.Now()), Expiry: josejwt.NewNumericDate(clock.Now().Add(10 * time.Minute))}
			id, err := v.Verify(t.Context(), mint(t, k.rsa, "", nil, claims))
			if got := identity.ReasonOf(err); got != tt.wantReason {
				t.Fatalf("Verify() = %v, want reason %q", err, tt.wantReason)
			}
			if err == nil && id.JWT.Subject != "vm-01.example.com" {
				t.Errorf("subject %q", id.JWT.Subject)
			}
			// Discovery is not repeated for every token: once per
			// minimum refresh interval at most.
			_, _ = v.Verify(t.Context(), mint(t, k.rsa, "", nil, claims))
			if got := s.discovery.Load(); got > 1 {
				t.Errorf("%d discovery fetches for two tokens, want at most 1", got)
			}
		})
	}
}

// Each jti is accepted once within the token's lifetime; tokens valid for
// longer than maxTokenLifetime are refused.
func TestReplayAndLifetime(t *testing.T) {
	k := testKeys(t)
	clock := newFakeClock()
	now := clock.Now()
	v, err := jwt.NewVerifier([]jwt.IssuerConfig{
		{Issuer: testIssuer, ShortName: "corp", Audiences: []string{testAudience}, JWKS: jwks(t, k.rsa), MaxTokenLifetime: time.Hour},
		{Issuer: "https://nojti.example.com", ShortName: "nojti", Audiences: []string{testAudience}, JWKS: jwks(t, k.rsa), AllowTokensWithoutJTI: true},
	}, jwt.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	claims := func(iss, jti string, iat *time.Time, life time.Duration) josejwt.Claims {
		c := josejwt.Claims{Issuer: iss, Subject: "vm-01.example.com", Audience: josejwt.Audience{testAudience}, ID: jti,
			Expiry: josejwt.NewNumericDate(now.Add(life))}
		if iat != nil {
			c.IssuedAt = josejwt.NewNumericDate(*iat)
			c.Expiry = josejwt.NewNumericDate(iat.Add(life))
		}
		return c
	}
	hourAgo := now.Add(-59 * time.Minute)
	replayed := mint(t, k.rsa, "", nil, claims(testIssuer, "once", &now, 10*time.Minute))
	tests := []struct {
		name       string
		token      string
		wantReason identity.Reason
	}{
		{name: "first use", token: replayed},
		{name: "replay", token: replayed, wantReason: identity.ReasonReplayed},
		{name: "same jti, newly minted", token: mint(t, k.rsa, "", nil, claims(testIssuer, "once", &now, 10*time.Minute)), wantReason: identity.ReasonReplayed},
		{name: "same jti of another issuer", token: mint(t, k.rsa, "", nil, claims("https://nojti.example.com", "once", &now, 10*time.Minute))},
		{name: "lifetime of exactly the maximum", token: mint(t, k.rsa, "", nil, claims(testIssuer, "a", &hourAgo, time.Hour))},
		{name: "lifetime over the maximum", token: mint(t, k.rsa, "", nil, claims(testIssuer, "b", &now, time.Hour+time.Second)), wantReason: identity.ReasonLifetimeTooLong},
		{name: "no iat, remaining validity over the maximum", token: mint(t, k.rsa, "", nil, claims(testIssuer, "c", nil, 2*time.Hour)), wantReason: identity.ReasonLifetimeTooLong},
		{name: "no jti", token: mint(t, k.rsa, "", nil, claims(testIssuer, "", &now, time.Minute), map[string]any{"jti": ""}), wantReason: identity.ReasonMalformed},
		{name: "no jti, allowed by the issuer", token: mint(t, k.rsa, "", nil, claims("https://nojti.example.com", "", &now, time.Minute), map[string]any{"jti": ""})},
		// A refused token does not use up its jti.
		{name: "refused for its audience first", token: mint(t, k.rsa, "", nil, josejwt.Claims{Issuer: testIssuer, Subject: "s", Audience: josejwt.Audience{"other"}, ID: "kept", IssuedAt: josejwt.NewNumericDate(now), Expiry: josejwt.NewNumericDate(now.Add(time.Minute))}), wantReason: identity.ReasonWrongAudience},
		{name: "then its jti is still free", token: mint(t, k.rsa, "", nil, claims(testIssuer, "kept", &now, time.Minute))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := v.Verify(t.Context(), tt.token)
			if got := identity.ReasonOf(err); got != tt.wantReason {
				t.Fatalf("Verify() = %v, want reason %q", err, tt.wantReason)
			}
		})
	}
	// Once the token has expired (and the leeway passed) its jti may be
	// used again, by a new token.
	clock.Advance(12 * time.Minute)
	if _, err := v.Verify(t.Context(), mint(t, k.rsa, "", nil, claims(testIssuer, "once", ptr(clock.Now()), 10*time.Minute))); err != nil {
		t.Errorf("jti of an expired token refused: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

func TestSubjectPrefix(t *testing.T) {
	k := testKeys(t)
	clock := newFakeClock()
	const prefix = "system:serviceaccount:onprem:"
	v, err := jwt.NewVerifier([]jwt.IssuerConfig{{Issuer: testIssuer, ShortName: "kube", Audiences: []string{testAudience}, JWKS: jwks(t, k.rsa), SubjectPrefix: prefix}}, jwt.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		sub         string
		wantReason  identity.Reason
		wantSubject string
	}{
		{sub: prefix + "vm-01.example.com", wantSubject: "vm-01.example.com"},
		{sub: "system:serviceaccount:other:vm-01.example.com", wantReason: identity.ReasonWrongSubject},
		{sub: prefix, wantReason: identity.ReasonWrongSubject},
		{sub: "vm-01.example.com", wantReason: identity.ReasonWrongSubject},
	}
	for _, tt := range tests {
		t.Run(tt.sub, func(t *testing.T) {
			id, err := v.Verify(t.Context(), mint(t, k.rsa, "", nil, josejwt.Claims{Issuer: testIssuer, Subject: tt.sub, Audience: josejwt.Audience{testAudience},
				IssuedAt: josejwt.NewNumericDate(clock.Now()), Expiry: josejwt.NewNumericDate(clock.Now().Add(10 * time.Minute))}))
			if got := identity.ReasonOf(err); got != tt.wantReason {
				t.Fatalf("Verify() = %v, want reason %q", err, tt.wantReason)
			}
			if err == nil {
				if id.JWT.Subject != tt.wantSubject || id.JWT.ShortName != "kube" {
					t.Errorf("subject %q (issuer %s), want %q (kube)", id.JWT.Subject, id.JWT.ShortName, tt.wantSubject)
				}
			}
		})
	}
}
