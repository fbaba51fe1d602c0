package token_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/embark-mesh/embark/onboarding/token"
	"github.com/embark-mesh/embark/test/fixtures"
)

const (
	testIssuer   = "https://onboarding.example.com:15443"
	testAudience = "embark.io/onboarding/cluster-1"
)

// testNow is the fixed time tests issue at.
var testNow = time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)

func testRequest() token.Request {
	id := fixtures.AWSIdentity(fixtures.InstanceID)
	id.AWS.EC2.IAMRole = "ratings-vm"
	return token.Request{
		Namespace:        "bookinfo",
		Name:             "ratings-aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0",
		WorkloadGroup:    "ratings",
		WorkloadIdentity: "aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0",
		Verified:         &id,
	}
}

// clock is a settable clock for tests.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock(t time.Time) *clock { return &clock{now: t} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// RSA keys are slow to generate under the race detector; share them.
var (
	rsaOnce sync.Once
	rsaKeys [2]*rsa.PrivateKey
)

func rsaKey(t testing.TB, i int) *rsa.PrivateKey {
	t.Helper()
	rsaOnce.Do(func() {
		for j := range rsaKeys {
			k, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				panic(err)
			}
			rsaKeys[j] = k
		}
	})
	return rsaKeys[i]
}

func ecKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func edKey(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func mustKey(t testing.TB, priv crypto.Signer) *token.Key {
	t.Helper()
	k, err := token.NewKey(priv)
	if err != nil {
		t.Fatalf("NewKey(%T): %v", priv, err)
	}
	return k
}

func mustSet(t testing.TB, current, previous *token.Key) *token.KeySet {
	t.Helper()
	s, err := token.NewKeySet(current, previous)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newIssuer(t testing.TB, src token.KeySource, opts ...token.Option) *token.Issuer {
	t.Helper()
	iss, err := token.NewIssuer(src, testIssuer, testAudience, opts...)
	if err != nil {
		t.Fatalf("NewIssuer: %v", err)
	}
	return iss
}

func pemOf(t testing.TB, typ string, der []byte) []byte {
	t.Helper()
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func pkcs8(t testing.TB, priv any) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return pemOf(t, "PRIVATE KEY", der)
}

// validClaims returns the claims Issue would write at testNow.
func validClaims() map[string]any {
	return map[string]any{
		"iss": testIssuer,
		"aud": testAudience,
		"sub": "bookinfo/ratings-vm",
		"iat": testNow.Unix(),
		"nbf": testNow.Unix(),
		"exp": testNow.Add(time.Hour).Unix(),
		"jti": "abc",
		token.WorkloadClaimKey: map[string]any{
			"workloadGroup": "bookinfo/ratings",
			"identity":      "aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0",
		},
	}
}

// signRaw signs payload with priv under alg, with the given kid and extra
// protected headers, the way an attacker with that key could.
func signRaw(t testing.TB, alg jose.SignatureAlgorithm, priv any, kid string, payload []byte, extra map[jose.HeaderKey]any) string {
	t.Helper()
	opts := &jose.SignerOptions{ExtraHeaders: map[jose.HeaderKey]any{}}
	opts.WithType("JWT")
	for k, v := range extra {
		opts.WithHeader(k, v)
	}
	key := any(priv)
	if kid != "" {
		key = jose.JSONWebKey{Key: priv, KeyID: kid}
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
	if err != nil {
		t.Fatalf("NewSigner(%s): %v", alg, err)
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	s, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func signClaims(t testing.TB, alg jose.SignatureAlgorithm, priv any, kid string, claims map[string]any) string {
	t.Helper()
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	return signRaw(t, alg, priv, kid, payload, nil)
}

// unsigned builds a compact JWS from a raw header and payload with the given
// signature bytes, for alg none and other hand-made tokens.
func unsigned(header string, payload []byte, sig []byte) string {
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(header)) + "." + enc.EncodeToString(payload) + "." + enc.EncodeToString(sig)
}

// tokenHeader decodes the protected header of a compact JWS.
func tokenHeader(t testing.TB, tok string) map[string]any {
	t.Helper()
	h, _, ok := strings.Cut(tok, ".")
	if !ok {
		t.Fatalf("not a compact JWS: %q", tok)
	}
	raw, err := base64.RawURLEncoding.DecodeString(h)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// tokenPayload decodes the payload of a compact JWS.
func tokenPayload(t testing.TB, tok string) map[string]any {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("not a compact JWS: %q", tok)
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}
