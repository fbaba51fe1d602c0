package gce_test

import (
	"errors"
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/gce"
	"github.com/embark-mesh/embark/onboarding/identity/gce/gcetest"
	"github.com/embark-mesh/embark/onboarding/identity/jwt"
	"github.com/embark-mesh/embark/onboarding/identity/replay"
	"github.com/embark-mesh/embark/onboarding/identity/replay/replaytest"
)

// Two verifiers (two replicas) sharing a store accept a token once between
// them; a store that cannot answer refuses nothing for good: the same token
// is accepted once it answers again.
func TestSharedReplay(t *testing.T) {
	g, err := gcetest.NewGoogle()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	shared := replaytest.NewShared(true)
	newVerifier := func() *gce.Verifier {
		v, err := gce.NewVerifier(gce.Config{Audiences: []string{audience}, JWKSURL: g.JWKSURL(), CACertificates: g.CACertificates()},
			jwt.WithClock(func() time.Time { return now }), jwt.WithSharedReplay(shared))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	a, b := newVerifier(), newVerifier()
	tok, err := g.Sign(gcetest.DefaultInstance().Claims(audience, now.Add(-time.Minute)))
	if err != nil {
		t.Fatal(err)
	}

	_, err = a.Verify(t.Context(), tok)
	if !errors.Is(err, replay.ErrUnavailable) || identity.ReasonOf(err) != "" {
		t.Fatalf("store down: Verify() = %v, want replay.ErrUnavailable and no refusal reason", err)
	}
	shared.SetDown(false)
	if _, err := a.Verify(t.Context(), tok); err != nil {
		t.Fatalf("the same token once the store answers, at the same replica: %v", err)
	}
	if _, err := b.Verify(t.Context(), tok); identity.ReasonOf(err) != identity.ReasonReplayed {
		t.Fatalf("the token at the other replica: Verify() = %v, want %s", err, identity.ReasonReplayed)
	}
}
