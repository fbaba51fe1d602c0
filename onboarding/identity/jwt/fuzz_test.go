package jwt_test

import (
	"testing"
	"time"

	josejwt "github.com/go-jose/go-jose/v4/jwt"

	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/jwt"
)

// FuzzVerify drives the JWT path (header pre-check, go-jose parsing, key
// selection, signature and claims checks, attribute extraction) with
// arbitrary tokens. It never panics, every refusal has a reason, and an
// accepted token is one of the issuer's with a subject.
func FuzzVerify(f *testing.F) {
	k := testKeys(f)
	now := time.Now()
	v, err := jwt.NewVerifier([]jwt.IssuerConfig{{
		Issuer: testIssuer, ShortName: "corp", Audiences: []string{testAudience},
		JWKS:       jwks(f, k.rsa, k.ec256, k.ed),
		Attributes: map[string]string{"region": "custom.region", "deep": "a.b.c.d"},
	}}, jwt.WithClock(func() time.Time { return now }))
	if err != nil {
		f.Fatal(err)
	}
	claims := josejwt.Claims{Issuer: testIssuer, Subject: "vm-1", Audience: josejwt.Audience{testAudience}, Expiry: josejwt.NewNumericDate(now.Add(time.Hour))}
	extra := map[string]any{"custom": map[string]any{"region": "eu"}, "a": map[string]any{"b": []any{1, 2}}}
	f.Add(mint(f, k.rsa, "", nil, claims, extra))
	f.Add(mint(f, k.ec256, "", nil, claims))
	f.Add(mint(f, k.ed, "", strp(""), claims))
	f.Add(unsigned(f, `{"alg":"none"}`, claims))
	f.Add(unsigned(f, `{"alg":"HS256","kid":"rsa-1"}`, claims))
	f.Add("eyJhbGciOiJSUzI1NiJ9.e30.")
	f.Add("...")
	f.Fuzz(func(t *testing.T, token string) {
		id, err := v.Verify(t.Context(), token)
		if err != nil {
			if identity.ReasonOf(err) == "" {
				t.Fatalf("refusal without reason: %v", err)
			}
			if id != nil {
				t.Fatal("identity returned with an error")
			}
			return
		}
		if id.JWT == nil || id.JWT.Issuer != testIssuer || id.JWT.Subject == "" {
			t.Fatalf("accepted token yields %+v", id.JWT)
		}
	})
}
