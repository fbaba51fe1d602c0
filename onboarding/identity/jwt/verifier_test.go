package jwt_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	josejwt "github.com/go-jose/go-jose/v4/jwt"

	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/jwt"
)

const (
	testIssuer   = "https://idp.example.com"
	testAudience = "embark-onboarding"
)

func strp(s string) *string { return &s }

func inlineVerifier(t *testing.T, now func() time.Time, ks ...testKey) *jwt.Verifier {
	t.Helper()
	v, err := jwt.NewVerifier([]jwt.IssuerConfig{{
		Issuer:     testIssuer,
		ShortName:  "corp",
		Audiences:  []string{testAudience, "other-audience"},
		JWKS:       jwks(t, ks...),
		Attributes: map[string]string{"region": "custom.location.region", "tier": "custom.tier", "groups": "groups", "managed": "custom.managed", "object": "custom.location"},
	}}, jwt.WithClock(now))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestVerify(t *testing.T) {
	k := testKeys(t)
	clock := newFakeClock()
	now := clock.Now()
	v := inlineVerifier(t, clock.Now, k.rsa, k.rsaSmall, k.ec256, k.ec384, k.ec521, k.ed)

	std := func(mod func(c *josejwt.Claims)) josejwt.Claims {
		c := josejwt.Claims{
			Issuer:    testIssuer,
			Subject:   "vm-01.example.com",
			Audience:  josejwt.Audience{testAudience},
			Expiry:    josejwt.NewNumericDate(now.Add(10 * time.Minute)),
			NotBefore: josejwt.NewNumericDate(now.Add(-time.Minute)),
			IssuedAt:  josejwt.NewNumericDate(now.Add(-time.Minute)),
		}
		if mod != nil {
			mod(&c)
		}
		return c
	}
	attacker := testKey{kid: "rsa-1", alg: jose.RS256, key: mustRSA(t)}

	// The classic key-confusion forgery: HS256 keyed with the RSA public key.
	hsConfusion := func() string {
		der, err := x509.MarshalPKIXPublicKey(k.rsa.key.Public())
		if err != nil {
			t.Fatal(err)
		}
		enc := base64.RawURLEncoding.EncodeToString
		payload, _ := json.Marshal(std(nil))
		signingInput := enc([]byte(`{"alg":"HS256","kid":"rsa-1","typ":"JWT"}`)) + "." + enc(payload)
		mac := hmac.New(sha256.New, der)
		mac.Write([]byte(signingInput))
		return signingInput + "." + enc(mac.Sum(nil))
	}()

	embeddedJWK := func() string {
		signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: attacker.key}, (&jose.SignerOptions{EmbedJWK: true}).WithType("JWT"))
		if err != nil {
			t.Fatal(err)
		}
		tok, err := josejwt.Signed(signer).Claims(std(nil)).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}()

	hs256, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: []byte("0123456789abcdef0123456789abcdef")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	hsToken, err := josejwt.Signed(hs256).Claims(std(nil)).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	valid := mint(t, k.rsa, "", nil, std(nil))
	validParts := strings.Split(valid, ".")

	tests := []struct {
		name        string
		token       string
		wantReason  identity.Reason
		wantSubject string
	}{
		{name: "RS256", token: valid, wantSubject: "vm-01.example.com"},
		{name: "RS384", token: mint(t, k.rsa, jose.RS384, nil, std(nil)), wantSubject: "vm-01.example.com"},
		{name: "RS512", token: mint(t, k.rsa, jose.RS512, nil, std(nil)), wantSubject: "vm-01.example.com"},
		{name: "PS256", token: mint(t, k.rsa, jose.PS256, nil, std(nil)), wantSubject: "vm-01.example.com"},
		{name: "PS384", token: mint(t, k.rsa, jose.PS384, nil, std(nil)), wantSubject: "vm-01.example.com"},
		{name: "PS512", token: mint(t, k.rsa, jose.PS512, nil, std(nil)), wantSubject: "vm-01.example.com"},
		{name: "ES256", token: mint(t, k.ec256, "", nil, std(nil)), wantSubject: "vm-01.example.com"},
		{name: "ES384", token: mint(t, k.ec384, "", nil, std(nil)), wantSubject: "vm-01.example.com"},
		{name: "ES512", token: mint(t, k.ec521, "", nil, std(nil)), wantSubject: "vm-01.example.com"},
		{name: "EdDSA", token: mint(t, k.ed, "", nil, std(nil)), wantSubject: "vm-01.example.com"},
		{name: "no kid", token: mint(t, k.ec256, "", strp(""), std(nil)), wantSubject: "vm-01.example.com"},
		{name: "second configured audience", token: mint(t, k.rsa, "", nil, std(func(c *josejwt.Claims) { c.Audience = josejwt.Audience{"x", "other-audience"} })), wantSubject: "vm-01.example.com"},
		{name: "expired within leeway", token: mint(t, k.rsa, "", nil, std(func(c *josejwt.Claims) { c.Expiry = josejwt.NewNumericDate(now.Add(-30 * time.Second)) })), wantSubject: "vm-01.example.com"},
		{name: "nbf within leeway", token: mint(t, k.rsa, "", nil, std(func(c *josejwt.Claims) { c.NotBefore = josejwt.NewNumericDate(now.Add(30 * time.Second)) })), wantSubject: "vm-01.example.com"},
		{name: "expired", token: mint(t, k.rsa, "", nil, std(func(c *josejwt.Claims) { c.Expiry = josejwt.NewNumericDate(now.Add(-2 * time.Minute)) })), wantReason: identity.ReasonExpired},
		{name: "not yet valid", token: mint(t, k.rsa, "", nil, std(func(c *josejwt.Claims) { c.NotBefore = josejwt.NewNumericDate(now.Add(5 * time.Minute)) })), wantReason: identity.ReasonNotYetValid},
		{name: "issued in the future", token: mint(t, k.rsa, "", nil, std(func(c *josejwt.Claims) { c.IssuedAt = josejwt.NewNumericDate(now.Add(5 * time.Minute)) })), wantReason: identity.ReasonNotYetValid},
		{name: "wrong issuer", token: mint(t, k.rsa, "", nil, std(func(c *josejwt.Claims) { c.Issuer = "https://evil.example.com" })), wantReason: identity.ReasonUnknownIssuer},
		{name: "issuer differs by trailing slash", token: mint(t, k.rsa, "", nil, std(func(c *josejwt.Claims) { c.Issuer = testIssuer + "/" })), wantReason: identity.ReasonUnknownIssuer},
		{name: "no issuer", token: mint(t, k.rsa, "", nil, std(func(c *josejwt.Claims) { c.Issuer = "" })), wantReason: identity.ReasonUnknownIssuer},
		{name: "wrong audience", token: mint(t, k.rsa, "", nil, std(func(c *josejwt.Claims) { c.Audience = josejwt.Audience{"someone-else"} })), wantReason: identity.ReasonWrongAudience},
		{name: "no audience", token: mint(t, k.rsa, "", nil, std(func(c *josejwt.Claims) { c.Audience = nil })), wantReason: identity.ReasonWrongAudience},
		{name: "unknown key", token: mint(t, k.rsa, "", strp("rotated-away"), std(nil)), wantReason: identity.ReasonUnknownKey},
		{name: "RSA key below 2048 bits", token: mint(t, k.rsaSmall, "", nil, std(nil)), wantReason: identity.ReasonUnknownKey},
		{name: "kid of a key of another type", token: mint(t, k.rsa, "", strp("ec-256"), std(nil)), wantReason: identity.ReasonUnknownKey},
		{name: "signed by another key with a known kid", token: mint(t, attacker, "", nil, std(nil)), wantReason: identity.ReasonBadSignature},
		{name: "attacker key embedded as jwk header", token: embeddedJWK, wantReason: identity.ReasonBadSignature},
		{name: "payload swapped", token: validParts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"iss":"`+testIssuer+`","sub":"admin","aud":"`+testAudience+`","exp":9999999999}`)) + "." + validParts[2], wantReason: identity.ReasonBadSignature},
		{name: "signature truncated", token: valid[:len(valid)-10], wantReason: identity.ReasonBadSignature},
		{name: "alg none", token: unsigned(t, `{"alg":"none","typ":"JWT"}`, std(nil)), wantReason: identity.ReasonDisallowedAlgorithm},
		{name: "alg None", token: unsigned(t, `{"alg":"None"}`, std(nil)), wantReason: identity.ReasonDisallowedAlgorithm},
		{name: "no alg", token: unsigned(t, `{"typ":"JWT"}`, std(nil)), wantReason: identity.ReasonDisallowedAlgorithm},
		{name: "HS256", token: hsToken, wantReason: identity.ReasonDisallowedAlgorithm},
		{name: "HS256 keyed with the RSA public key", token: hsConfusion, wantReason: identity.ReasonDisallowedAlgorithm},
		{name: "unknown alg", token: unsigned(t, `{"alg":"RS1"}`, std(nil)), wantReason: identity.ReasonDisallowedAlgorithm},
		{name: "no exp", token: mint(t, k.rsa, "", nil, std(func(c *josejwt.Claims) { c.Expiry = nil })), wantReason: identity.ReasonMalformed},
		{name: "no sub", token: mint(t, k.rsa, "", nil, std(func(c *josejwt.Claims) { c.Subject = "" })), wantReason: identity.ReasonMalformed},
		{name: "empty", token: "", wantReason: identity.ReasonMalformed},
		{name: "two parts", token: "a.b", wantReason: identity.ReasonMalformed},
		{name: "encrypted (five parts)", token: "a.b.c.d.e", wantReason: identity.ReasonMalformed},
		{name: "header not base64url", token: "!!!." + validParts[1] + "." + validParts[2], wantReason: identity.ReasonMalformed},
		// Go's base64 skips CR and LF and go-jose re-encodes the decoded parts
		// to rebuild the signing input: without the strict check these would
		// verify as the valid token.
		{name: "CR inserted into the payload", token: validParts[0] + "." + validParts[1][:8] + "\r\r" + validParts[1][8:] + "." + validParts[2], wantReason: identity.ReasonMalformed},
		{name: "LF inserted into the signature", token: validParts[0] + "." + validParts[1] + "." + validParts[2][:4] + "\n" + validParts[2][4:], wantReason: identity.ReasonMalformed},
		{name: "header not JSON", token: base64.RawURLEncoding.EncodeToString([]byte("RS256")) + "." + validParts[1] + "." + validParts[2], wantReason: identity.ReasonMalformed},
		{name: "too large", token: valid + strings.Repeat("A", jwt.MaxTokenSize), wantReason: identity.ReasonMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := v.Verify(t.Context(), tt.token)
			if got := identity.ReasonOf(err); got != tt.wantReason {
				t.Fatalf("Verify() error = %v, want reason %q", err, tt.wantReason)
			}
			if err != nil {
				if !errors.Is(err, tt.wantReason) || id != nil {
					t.Errorf("errors.Is(%v) = false or identity returned", tt.wantReason)
				}
				t.Logf("refused: %v", err)
				return
			}
			if id.Method != identity.MethodJWT || id.JWT.Subject != tt.wantSubject || id.JWT.Issuer != testIssuer || id.JWT.ShortName != "corp" {
				t.Errorf("identity %+v", id.JWT)
			}
		})
	}
}

func mustRSA(t *testing.T) *rsaKey {
	t.Helper()
	k, err := generateRSA()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestAttributes(t *testing.T) {
	k := testKeys(t)
	clock := newFakeClock()
	v := inlineVerifier(t, clock.Now, k.rsa)
	claims := josejwt.Claims{
		Issuer: testIssuer, Subject: "vm-1", Audience: josejwt.Audience{testAudience},
		Expiry: josejwt.NewNumericDate(clock.Now().Add(time.Hour)),
	}
	tests := []struct {
		name  string
		extra map[string]any
		want  map[string]string
	}{
		{
			name: "scalars at any depth",
			extra: map[string]any{
				"custom": map[string]any{"location": map[string]any{"region": "eu-west"}, "tier": 12345678901234567, "managed": true},
				"groups": "ops",
			},
			want: map[string]string{"region": "eu-west", "tier": "12345678901234567", "managed": "true", "groups": "ops"},
		},
		{name: "path through a non-object", extra: map[string]any{"custom": "not an object"}, want: map[string]string{}},
		{name: "null, array and object give no attribute", extra: map[string]any{"groups": []any{"a"}, "custom": map[string]any{"tier": nil, "location": map[string]any{}}}, want: map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := v.Verify(t.Context(), mint(t, k.rsa, "", nil, claims, tt.extra))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(id.JWT.Attributes, tt.want) {
				t.Errorf("attributes %v, want %v", id.JWT.Attributes, tt.want)
			}
		})
	}
}

func TestNewVerifierValidation(t *testing.T) {
	k := testKeys(t)
	good := func(mod func(c *jwt.IssuerConfig)) jwt.IssuerConfig {
		c := jwt.IssuerConfig{Issuer: testIssuer, ShortName: "corp", Audiences: []string{"a"}, JWKS: jwks(t, k.rsa)}
		if mod != nil {
			mod(&c)
		}
		return c
	}
	tests := []struct {
		name    string
		issuers []jwt.IssuerConfig
		opts    []jwt.Option
		wantErr string
	}{
		{name: "valid", issuers: []jwt.IssuerConfig{good(nil)}},
		{name: "valid JWKS URL", issuers: []jwt.IssuerConfig{good(func(c *jwt.IssuerConfig) { c.JWKS, c.JWKSURL = nil, "https://idp.example.com/keys" })}},
		{name: "no issuers is valid", issuers: nil},
		{name: "missing issuer", issuers: []jwt.IssuerConfig{good(func(c *jwt.IssuerConfig) { c.Issuer = "" })}, wantErr: "issuer is required"},
		{name: "missing shortName", issuers: []jwt.IssuerConfig{good(func(c *jwt.IssuerConfig) { c.ShortName = "" })}, wantErr: "shortName is required"},
		{name: "shortName not a label", issuers: []jwt.IssuerConfig{good(func(c *jwt.IssuerConfig) { c.ShortName = "Corp_IdP" })}, wantErr: "DNS-1123 label"},
		{name: "no audience", issuers: []jwt.IssuerConfig{good(func(c *jwt.IssuerConfig) { c.Audiences = nil })}, wantErr: "audience is required"},
		{name: "empty audience", issuers: []jwt.IssuerConfig{good(func(c *jwt.IssuerConfig) { c.Audiences = []string{""} })}, wantErr: "empty strings"},
		{name: "no key set, issuer not https (no OIDC discovery)", issuers: []jwt.IssuerConfig{good(func(c *jwt.IssuerConfig) { c.JWKS, c.Issuer = nil, "http://idp.example.com" })}, wantErr: "must be an https URL for OIDC discovery"},
		{name: "negative maxTokenLifetime", issuers: []jwt.IssuerConfig{good(func(c *jwt.IssuerConfig) { c.MaxTokenLifetime = -time.Second })}, wantErr: "must not be negative"},
		{name: "caCertificates without a certificate", issuers: []jwt.IssuerConfig{good(func(c *jwt.IssuerConfig) { c.CACertificates = []byte("nope") })}, wantErr: "holds no PEM certificate"},
		{name: "both key sets", issuers: []jwt.IssuerConfig{good(func(c *jwt.IssuerConfig) { c.JWKSURL = "https://x/keys" })}, wantErr: "mutually exclusive"},
		{name: "plain http JWKS URL", issuers: []jwt.IssuerConfig{good(func(c *jwt.IssuerConfig) { c.JWKS, c.JWKSURL = nil, "http://idp.example.com/keys" })}, wantErr: "https"},
		{name: "JWKS not JSON", issuers: []jwt.IssuerConfig{good(func(c *jwt.IssuerConfig) { c.JWKS = []byte("{") })}, wantErr: "parse JWKS"},
		{name: "JWKS with only a symmetric key", issuers: []jwt.IssuerConfig{good(func(c *jwt.IssuerConfig) { c.JWKS = []byte(`{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`) })}, wantErr: "no public signature keys"},
		{name: "JWKS with only an encryption key", issuers: []jwt.IssuerConfig{good(func(c *jwt.IssuerConfig) {
			jwk := k.rsa.publicJWK()
			jwk.Use = "enc"
			b, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{jwk}})
			c.JWKS = b
		})}, wantErr: "no public signature keys"},
		{name: "bad attribute path", issuers: []jwt.IssuerConfig{good(func(c *jwt.IssuerConfig) { c.Attributes = map[string]string{"x": "a..b"} })}, wantErr: "dotted claim path"},
		{name: "duplicate issuer", issuers: []jwt.IssuerConfig{good(nil), good(func(c *jwt.IssuerConfig) { c.ShortName = "other" })}, wantErr: "configured twice"},
		{name: "duplicate shortName", issuers: []jwt.IssuerConfig{good(nil), good(func(c *jwt.IssuerConfig) { c.Issuer = "https://other" })}, wantErr: "used by two issuers"},
		{name: "negative leeway", issuers: []jwt.IssuerConfig{good(nil)}, opts: []jwt.Option{jwt.WithLeeway(-time.Second)}, wantErr: "negative"},
		{name: "min refresh above refresh", issuers: []jwt.IssuerConfig{good(nil)}, opts: []jwt.Option{jwt.WithJWKSRefresh(time.Minute, time.Hour)}, wantErr: "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := jwt.NewVerifier(tt.issuers, tt.opts...)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("NewVerifier() = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("NewVerifier() = %v, want error containing %q", err, tt.wantErr)
			}
		})
	}
}

// A token of one issuer is checked with that issuer's keys and audiences
// only.
func TestIssuersAreSeparate(t *testing.T) {
	k := testKeys(t)
	clock := newFakeClock()
	v, err := jwt.NewVerifier([]jwt.IssuerConfig{
		{Issuer: "https://a.example.com", ShortName: "a", Audiences: []string{"aud-a"}, JWKS: jwks(t, k.rsa)},
		{Issuer: "https://b.example.com", ShortName: "b", Audiences: []string{"aud-b"}, JWKS: jwks(t, k.ec256)},
	}, jwt.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	claims := func(iss, aud string) josejwt.Claims {
		return josejwt.Claims{Issuer: iss, Subject: "s", Audience: josejwt.Audience{aud}, Expiry: josejwt.NewNumericDate(clock.Now().Add(time.Hour))}
	}
	tests := []struct {
		name          string
		token         string
		wantReason    identity.Reason
		wantShortName string
	}{
		{name: "a with a's key", token: mint(t, k.rsa, "", nil, claims("https://a.example.com", "aud-a")), wantShortName: "a"},
		{name: "b with b's key", token: mint(t, k.ec256, "", nil, claims("https://b.example.com", "aud-b")), wantShortName: "b"},
		{name: "b signed with a's key", token: mint(t, k.rsa, "", nil, claims("https://b.example.com", "aud-b")), wantReason: identity.ReasonUnknownKey},
		{name: "a with b's audience", token: mint(t, k.rsa, "", nil, claims("https://a.example.com", "aud-b")), wantReason: identity.ReasonWrongAudience},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := v.Verify(t.Context(), tt.token)
			if got := identity.ReasonOf(err); got != tt.wantReason {
				t.Fatalf("Verify() = %v, want reason %q", err, tt.wantReason)
			}
			if err == nil {
				if id.JWT.ShortName != tt.wantShortName {
					t.Errorf("issuer short name %s, want %s", id.JWT.ShortName, tt.wantShortName)
				}
			}
		})
	}
}
