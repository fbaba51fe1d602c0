package token_test

import (
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/token"
)

// fuzzKeyFile is the fixed P-256 key the fuzz target trusts, so that the
// committed seed corpus holds tokens it accepts.
const fuzzKeyFile = "testdata/fuzz-key.pem"

// fuzzNow is when the seed tokens are valid: they were issued at testNow.
var fuzzNow = testNow.Add(time.Minute)

func fuzzIssuer(f *testing.F) (*token.Issuer, *token.KeySet, *ecdsa.PublicKey) {
	f.Helper()
	data, err := os.ReadFile(fuzzKeyFile)
	if err != nil {
		f.Fatal(err)
	}
	key, err := token.ParseKeyPEM(data)
	if err != nil {
		f.Fatal(err)
	}
	pub, ok := key.Public().(*ecdsa.PublicKey)
	if !ok {
		f.Fatalf("%s is not an EC key", fuzzKeyFile)
	}
	set := mustSet(f, key, nil)
	iss, err := token.NewIssuer(token.NewStaticKeySource(set), testIssuer, testAudience,
		token.WithClock(func() time.Time { return fuzzNow }))
	if err != nil {
		f.Fatal(err)
	}
	return iss, set, pub
}

// FuzzVerify feeds arbitrary strings to Verify. Verify must not panic, must
// refuse with an *Error, and may accept a token only when an ECDSA check
// independent of go-jose confirms that the test key signed the token's
// header and payload, and the claims it returns are the signed ones.
func FuzzVerify(f *testing.F) {
	iss, set, pub := fuzzIssuer(f)
	// Seeds made at run time; testdata/fuzz/FuzzVerify holds fixed ones.
	issuing, err := token.NewIssuer(token.NewStaticKeySource(set), testIssuer, testAudience,
		token.WithClock(func() time.Time { return testNow }))
	if err != nil {
		f.Fatal(err)
	}
	good, _, err := issuing.Issue(testRequest())
	if err != nil {
		f.Fatal(err)
	}
	boundReq := testRequest()
	boundReq.SessionHash = strings.Repeat("c3", 32)
	bound, _, err := issuing.Issue(boundReq)
	if err != nil {
		f.Fatal(err)
	}
	parts := strings.Split(good, ".")
	for _, seed := range []string{
		good,
		bound,
		parts[0] + "." + parts[1] + ".",
		parts[0] + ".." + parts[2],
		good[:len(good)/2],
		"",
		".",
		"..",
		"a.b.c",
		`{"protected":"` + parts[0] + `","payload":"` + parts[1] + `","signature":"` + parts[2] + `"}`,
		// CI's find (2026-11-29): CR and LF inside a part, which Go's base64
		// skips, were accepted as the good token.
		parts[0] + "." + parts[1][:10] + "\r\r" + parts[1][10:] + "." + parts[2],
		parts[0] + "." + parts[1] + "\n." + parts[2],
	} {
		f.Add(seed)
	}

	f.Fuzz(func(t *testing.T, raw string) {
		claims, err := iss.Verify(raw)
		if err != nil {
			if claims != nil {
				t.Fatalf("Verify returned claims and an error %v", err)
			}
			if token.ReasonOf(err) == "" {
				t.Fatalf("Verify error %v is not an *Error", err)
			}
			return
		}
		checkGenuine(t, pub, raw, claims)
	})
}

// checkGenuine fails t unless raw carries an ES256 signature of the test key
// over its signing input and claims are its payload.
func checkGenuine(t *testing.T, pub *ecdsa.PublicKey, raw string, claims *token.Claims) {
	t.Helper()
	parts := strings.Split(raw, ".")
	if len(parts) != 3 {
		t.Fatalf("accepted %q, which is not three parts", raw)
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(sig) != 64 {
		t.Fatalf("accepted %q with a signature that is not 64 bytes of base64url (%v)", raw, err)
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	r, s := new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])
	if !ecdsa.Verify(pub, digest[:], r, s) {
		t.Fatalf("accepted %q, which the test key did not sign", raw)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatalf("accepted %q with a payload that is not base64url: %v", raw, err)
	}
	var signed struct {
		Sub string `json:"sub"`
		Jti string `json:"jti"`
		Aud any    `json:"aud"`
		Cnf struct {
			Session string `json:"embark.io/session-sha256"`
		} `json:"cnf"`
	}
	if err := json.Unmarshal(payload, &signed); err != nil {
		t.Fatalf("accepted %q with a payload that is not JSON: %v", raw, err)
	}
	if claims.Subject != signed.Sub || claims.ID != signed.Jti || claims.Audience != testAudience || claims.Issuer != testIssuer ||
		claims.SessionHash != signed.Cnf.Session {
		t.Fatalf("accepted %q with claims %+v that differ from the signed payload %s", raw, claims, payload)
	}
}

// The committed seeds stay meaningful: the valid one is accepted, each of the
// others is refused for its own reason.
func TestFuzzCorpus(t *testing.T) {
	data, err := os.ReadFile(fuzzKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	key, err := token.ParseKeyPEM(data)
	if err != nil {
		t.Fatal(err)
	}
	iss := newIssuer(t, token.NewStaticKeySource(mustSet(t, key, nil)), token.WithClock(func() time.Time { return fuzzNow }))
	tests := []struct {
		name       string
		wantReason token.Reason
	}{
		{name: "valid"},
		{name: "alg-none", wantReason: token.ReasonDisallowedAlgorithm},
		{name: "hs256-public-key", wantReason: token.ReasonDisallowedAlgorithm},
		// Its signature cut short ends in a character whose unused bits
		// are set: not canonical base64url, refused before the signature
		// is checked (internal/compactjws).
		{name: "truncated", wantReason: token.ReasonMalformed},
		{name: "no-signature", wantReason: token.ReasonBadSignature},
		{name: "exp-huge", wantReason: token.ReasonMalformed},
		{name: "audiences", wantReason: token.ReasonWrongAudience},
		{name: "garbage", wantReason: token.ReasonUnknownKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, err := os.ReadFile("testdata/fuzz/FuzzVerify/" + tt.name)
			if err != nil {
				t.Fatal(err)
			}
			header, value, ok := strings.Cut(strings.TrimSpace(string(raw)), "\n")
			if !ok || header != "go test fuzz v1" || !strings.HasPrefix(value, "string(") || !strings.HasSuffix(value, ")") {
				t.Fatalf("corpus file %s is not a go test fuzz v1 string", tt.name)
			}
			tok, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(value, "string("), ")"))
			if err != nil {
				t.Fatal(err)
			}
			_, err = iss.Verify(tok)
			if tt.wantReason == "" && err != nil || tt.wantReason != "" && !errors.Is(err, tt.wantReason) {
				t.Errorf("Verify(%s) error = %v, want reason %q", tt.name, err, tt.wantReason)
			}
		})
	}
}
