package jwttest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/replay"
	"github.com/embark-mesh/embark/onboarding/identity/replay/replaytest"
)

// TokenVerifier verifies a bearer identity token, as the generic JWT,
// GCE and Azure verifiers do; the checks below hold for each of them.
type TokenVerifier interface {
	Verify(ctx context.Context, token string) (*identity.Identity, error)
}

// Unsigned is token with its signature dropped and its header replaced by
// {"alg":"none"}: a token no key signed.
func Unsigned(token string) string {
	parts := strings.Split(token, ".")
	return "eyJhbGciOiJub25lIn0." + parts[1] + "."
}

// Refused checks that v refuses token for reason, with an error that names
// want.
func Refused(t *testing.T, v TokenVerifier, token string, reason error, want string) {
	t.Helper()
	id, err := v.Verify(t.Context(), token)
	if err == nil {
		t.Fatalf("accepted: %+v", id)
	}
	if !errors.Is(err, reason) {
		t.Errorf("reason %q, want %q (%v)", identity.ReasonOf(err), reason, err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
}

// EachTokenOnce checks that v accepts two tokens of one workload once each:
// first and second are accepted, second again is refused as replayed.
func EachTokenOnce(t *testing.T, v TokenVerifier, first, second string) {
	t.Helper()
	for i, tok := range []string{first, second} {
		if _, err := v.Verify(t.Context(), tok); err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
	}
	if _, err := v.Verify(t.Context(), second); !errors.Is(err, identity.ReasonReplayed) {
		t.Fatalf("second token again: %v, want Replayed", err)
	}
}

// SharedReplay checks two verifiers a and b (two replicas) sharing the
// replay store shared, down at first, with token: while the store cannot
// answer, a refuses nothing for good (replay.ErrUnavailable, no refusal
// reason); once it answers, a accepts the same token and b refuses it as
// replayed.
func SharedReplay(t *testing.T, shared *replaytest.Shared, a, b TokenVerifier, token string) {
	t.Helper()
	_, err := a.Verify(t.Context(), token)
	if !errors.Is(err, replay.ErrUnavailable) || identity.ReasonOf(err) != "" {
		t.Fatalf("store down: Verify() = %v, want replay.ErrUnavailable and no refusal reason", err)
	}
	shared.SetDown(false)
	if _, err := a.Verify(t.Context(), token); err != nil {
		t.Fatalf("the same token once the store answers, at the same replica: %v", err)
	}
	if _, err := b.Verify(t.Context(), token); identity.ReasonOf(err) != identity.ReasonReplayed {
		t.Fatalf("the token at the other replica: Verify() = %v, want %s", err, identity.ReasonReplayed)
	}
}

// Seeds are the seed corpus of a verifier's fuzz target, which adds them
// itself (f.Add in the target, where test/fuzz/run.sh looks for a committed
// corpus): the valid token, nothing, a shape with nothing in it, and the
// first half of the valid token.
func Seeds(valid string) []string { return []string{valid, "", "a.b.c", valid[:len(valid)/2]} }

// FuzzVerify feeds arbitrary tokens to the verifier newVerifier makes (the
// target seeded with Seeds(valid)): it must refuse or accept, never panic,
// and never accept a token other than valid, the one issuer signed.
func FuzzVerify(f *testing.F, issuer, valid string, newVerifier func(*testing.T) TokenVerifier) {
	f.Fuzz(func(t *testing.T, tok string) {
		id, err := newVerifier(t).Verify(t.Context(), tok)
		if err == nil && tok != valid {
			t.Fatalf("accepted a token %s did not issue: %q -> %+v", issuer, tok, id)
		}
	})
}

// Forged signs claims under the key ID kid with a key of its own: a token
// that names the provider's key but that key did not sign.
func Forged(t *testing.T, kid string, claims map[string]any) string {
	t.Helper()
	key, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := SignWith(key, kid, claims)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// Used returns token after v accepted it once: a token that is already
// used.
func Used(t *testing.T, v TokenVerifier, token string) string {
	t.Helper()
	if _, err := v.Verify(t.Context(), token); err != nil {
		t.Fatalf("first use: %v", err)
	}
	return token
}

// Forgery is a token a verifier must refuse: Token builds it from a
// fixture of the provider's tests (F) and valid claims; the refusal has
// WantReason and an error that names WantMsg.
type Forgery[F any] struct {
	Name       string
	Token      func(t *testing.T, f F, claims map[string]any) string
	WantReason identity.Reason
	WantMsg    string
}

// RefuseForgeries checks each forgery in a subtest of its own against a
// fresh fixture: setup returns the fixture, its verifier and valid claims.
func RefuseForgeries[F any](t *testing.T, forgeries []Forgery[F], setup func(*testing.T) (F, TokenVerifier, map[string]any)) {
	t.Helper()
	for _, tt := range forgeries {
		t.Run(tt.Name, func(t *testing.T) {
			f, v, claims := setup(t)
			Refused(t, v, tt.Token(t, f, claims), tt.WantReason, tt.WantMsg)
		})
	}
}
