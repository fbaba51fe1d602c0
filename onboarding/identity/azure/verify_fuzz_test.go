package azure_test

import (
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity/azure/azuretest"
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
	f.Add(valid)
	f.Add("")
	f.Add("a.b.c")
	f.Add(valid[:len(valid)/2])
	f.Fuzz(func(t *testing.T, tok string) {
		fx := newFixtureWith(t, m)
		id, err := fx.v.Verify(t.Context(), tok)
		if err == nil && tok != valid {
			t.Fatalf("accepted a token Microsoft did not issue: %q -> %+v", tok, id.Azure)
		}
	})
}
