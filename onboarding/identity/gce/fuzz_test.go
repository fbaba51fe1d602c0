package gce_test

import (
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity/gce/gcetest"
	"github.com/embark-mesh/embark/onboarding/identity/jwt/jwttest"
)

// FuzzVerify feeds arbitrary tokens (seeded with a valid one and its
// pieces) to the verifier: it must refuse or accept, never panic, and never
// accept a token Google's key did not sign.
func FuzzVerify(f *testing.F) {
	g, err := gcetest.NewGoogle()
	if err != nil {
		f.Fatal(err)
	}
	defer g.Close()
	fx := &fixture{google: g, now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	valid, err := g.Token(gcetest.DefaultInstance(), audience, fx.now.Add(-time.Minute))
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range jwttest.Seeds(valid) {
		f.Add(seed)
	}
	jwttest.FuzzVerify(f, "Google", valid, func(t *testing.T) jwttest.TokenVerifier { return newFixtureWith(t, g).v })
}
