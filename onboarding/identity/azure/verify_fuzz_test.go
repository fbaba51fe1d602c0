package azure_test

import (
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity/azure/azuretest"
	"github.com/embark-mesh/embark/onboarding/identity/jwt/jwttest"
)

// FuzzVerify feeds arbitrary tokens (seeded with a valid one and its
// pieces) to the verifier: it must refuse or accept, never panic, and never
// accept a token Microsoft's key did not sign.
func FuzzVerify(f *testing.F) {
	m, err := azuretest.NewMicrosoft()
	if err != nil {
		f.Fatal(err)
	}
	defer m.Close()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	valid, err := m.Token(azuretest.DefaultVM(), audience, now.Add(-time.Minute))
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range jwttest.Seeds(valid) {
		f.Add(seed)
	}
	jwttest.FuzzVerify(f, "Microsoft", valid, func(t *testing.T) jwttest.TokenVerifier { return newFixtureWith(t, m).v })
}
