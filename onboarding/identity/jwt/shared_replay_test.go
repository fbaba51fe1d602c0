package jwt_test

import (
	"errors"
	"testing"
	"time"

	josejwt "github.com/go-jose/go-jose/v4/jwt"

	"github.com/embark-mesh/embark/onboarding/identity/jwt"
	"github.com/embark-mesh/embark/onboarding/identity/jwt/jwttest"
	"github.com/embark-mesh/embark/onboarding/identity/replay"
	"github.com/embark-mesh/embark/onboarding/identity/replay/replaytest"
)

// Two verifiers (two replicas) sharing a store accept a jti once between
// them; a store that cannot answer refuses nothing for good: the same token
// is accepted once it answers again.
func TestSharedReplay(t *testing.T) {
	k := testKeys(t)
	clock := newFakeClock()
	now := clock.Now()
	shared := replaytest.NewShared(true)
	newVerifier := func() *jwt.Verifier {
		v, err := jwt.NewVerifier([]jwt.IssuerConfig{{Issuer: testIssuer, ShortName: "corp", Audiences: []string{testAudience}, JWKS: jwks(t, k.rsa)}},
			jwt.WithClock(clock.Now), jwt.WithSharedReplay(shared))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	a, b := newVerifier(), newVerifier()
	tok := mint(t, k.rsa, "", nil, josejwt.Claims{Issuer: testIssuer, Subject: "vm-01", Audience: josejwt.Audience{testAudience}, ID: "once",
		IssuedAt: josejwt.NewNumericDate(now), Expiry: josejwt.NewNumericDate(now.Add(10 * time.Minute))})

	jwttest.SharedReplay(t, shared, a, b, tok)
}

// A token without jti is reserved by its signature: once per verifier and
// scope, once per deployment with a shared store; a store that cannot
// answer leaves the token unused, so that it is accepted once it answers.
func TestReserveToken(t *testing.T) {
	k := testKeys(t)
	clock := newFakeClock()
	now := clock.Now()
	shared := replaytest.NewShared(true)
	newVerifier := func() *jwt.Verifier {
		v, err := jwt.NewVerifier([]jwt.IssuerConfig{{Issuer: testIssuer, ShortName: "corp", Audiences: []string{testAudience}, JWKS: jwks(t, k.rsa), AllowTokensWithoutJTI: true}},
			jwt.WithClock(clock.Now), jwt.WithSharedReplay(shared))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	a, b := newVerifier(), newVerifier()
	tok := mint(t, k.rsa, "", nil, josejwt.Claims{Issuer: testIssuer, Subject: "vm-01", Audience: josejwt.Audience{testAudience},
		IssuedAt: josejwt.NewNumericDate(now), Expiry: josejwt.NewNumericDate(now.Add(10 * time.Minute))})
	expiry := now.Add(10 * time.Minute)

	if _, err := a.ReserveToken(t.Context(), "cloud", tok, expiry); !errors.Is(err, replay.ErrUnavailable) {
		t.Fatalf("store down: ReserveToken() = %v, want replay.ErrUnavailable", err)
	}
	shared.SetDown(false)
	for _, tt := range []struct {
		name      string
		v         *jwt.Verifier
		scope     string
		wantFresh bool
	}{
		{name: "first use, once the store answers", v: a, scope: "cloud", wantFresh: true},
		{name: "again at the same replica", v: a, scope: "cloud"},
		{name: "at the other replica", v: b, scope: "cloud"},
		{name: "in another scope", v: b, scope: "other", wantFresh: true},
	} {
		fresh, err := tt.v.ReserveToken(t.Context(), tt.scope, tok, expiry)
		if err != nil || fresh != tt.wantFresh {
			t.Errorf("%s: ReserveToken() = %v, %v; want %v, nil", tt.name, fresh, err, tt.wantFresh)
		}
	}
}
