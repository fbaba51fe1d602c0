package token_test

import (
	"crypto"
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/token"
)

func benchKeys(b *testing.B) []struct {
	name string
	priv crypto.Signer
} {
	return []struct {
		name string
		priv crypto.Signer
	}{
		{name: "ES256", priv: ecKey(b)},
		{name: "RS256", priv: rsaKey(b, 0)},
		{name: "EdDSA", priv: edKey(b)},
	}
}

func BenchmarkIssue(b *testing.B) {
	for _, k := range benchKeys(b) {
		b.Run(k.name, func(b *testing.B) {
			iss := newIssuer(b, token.NewStaticKeySource(mustSet(b, mustKey(b, k.priv), nil)))
			req := testRequest()
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := iss.Issue(req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkVerify(b *testing.B) {
	for _, k := range benchKeys(b) {
		b.Run(k.name, func(b *testing.B) {
			// The token is signed by the previous key, the slower lookup.
			old := mustKey(b, k.priv)
			src := token.NewStaticKeySource(mustSet(b, old, nil))
			now := func() time.Time { return testNow }
			iss := newIssuer(b, src, token.WithClock(now))
			tok, _, err := iss.Issue(testRequest())
			if err != nil {
				b.Fatal(err)
			}
			src.Set(mustSet(b, mustKey(b, ecKey(b)), old))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := iss.Verify(tok); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
