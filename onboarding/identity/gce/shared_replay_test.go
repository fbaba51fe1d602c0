package gce_test

import (
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity/gce"
	"github.com/embark-mesh/embark/onboarding/identity/gce/gcetest"
	"github.com/embark-mesh/embark/onboarding/identity/jwt"
	"github.com/embark-mesh/embark/onboarding/identity/jwt/jwttest"
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
	jwttest.SharedReplay(t, shared, a, b, tok)
}
