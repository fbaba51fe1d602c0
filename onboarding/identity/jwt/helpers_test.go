package jwt_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	josejwt "github.com/go-jose/go-jose/v4/jwt"
)

// testKey is a private key with its kid and the alg it signs with.
type testKey struct {
	kid string
	alg jose.SignatureAlgorithm
	key crypto.Signer
}

func (k testKey) publicJWK() jose.JSONWebKey {
	return jose.JSONWebKey{Key: k.key.Public(), KeyID: k.kid, Use: "sig"}
}

type keyring struct {
	rsa, rsaSmall, ec256, ec384, ec521, ed testKey
}

var (
	keysOnce sync.Once
	keys     keyring
)

// testKeys generates the keys once per test binary.
func testKeys(t testing.TB) keyring {
	t.Helper()
	keysOnce.Do(func() {
		must := func(k crypto.Signer, err error) crypto.Signer {
			if err != nil {
				panic(err)
			}
			return k
		}
		_, edKey, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			panic(err)
		}
		keys = keyring{
			rsa:      testKey{kid: "rsa-1", alg: jose.RS256, key: must(rsa.GenerateKey(rand.Reader, 2048))},
			rsaSmall: testKey{kid: "rsa-small", alg: jose.RS256, key: must(rsa.GenerateKey(rand.Reader, 1024))},
			ec256:    testKey{kid: "ec-256", alg: jose.ES256, key: must(ecdsa.GenerateKey(elliptic.P256(), rand.Reader))},
			ec384:    testKey{kid: "ec-384", alg: jose.ES384, key: must(ecdsa.GenerateKey(elliptic.P384(), rand.Reader))},
			ec521:    testKey{kid: "ec-521", alg: jose.ES512, key: must(ecdsa.GenerateKey(elliptic.P521(), rand.Reader))},
			ed:       testKey{kid: "ed-1", alg: jose.EdDSA, key: edKey},
		}
	})
	return keys
}

func jwks(t testing.TB, ks ...testKey) []byte {
	t.Helper()
	set := jose.JSONWebKeySet{}
	for _, k := range ks {
		set.Keys = append(set.Keys, k.publicJWK())
	}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var jtiCounter atomic.Int64

// mint signs claims with key using alg (key.alg if empty), setting kid
// (key.kid if kid is nil).
func mint(t testing.TB, key testKey, alg jose.SignatureAlgorithm, kid *string, claims ...any) string {
	t.Helper()
	if alg == "" {
		alg = key.alg
	}
	k := key.kid
	if kid != nil {
		k = *kid
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: jose.JSONWebKey{Key: key.key, KeyID: k}}, (&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	b := josejwt.Signed(signer)
	hasID := false
	for _, c := range claims {
		b = b.Claims(c)
		switch c := c.(type) {
		case josejwt.Claims:
			hasID = hasID || c.ID != ""
		case map[string]any:
			_, ok := c["jti"]
			hasID = hasID || ok
		}
	}
	if !hasID {
		// Every token is single-use: give each its own jti.
		b = b.Claims(map[string]any{"jti": fmt.Sprintf("test-%d", jtiCounter.Add(1))})
	}
	tok, err := b.Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// unsigned builds an alg "none" token.
func unsigned(t testing.TB, header string, claims any) string {
	t.Helper()
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(header)) + "." + enc(payload) + "."
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Now()} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type rsaKey = rsa.PrivateKey

func generateRSA() (*rsa.PrivateKey, error) { return rsa.GenerateKey(rand.Reader, 2048) }
