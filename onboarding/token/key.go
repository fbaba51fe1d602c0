package token

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"

	jose "github.com/go-jose/go-jose/v4"
)

// The bounds of an RSA signing key's modulus, in bits.
const (
	MinRSAKeyBits = 2048
	MaxRSAKeyBits = 8192
)

// ErrUnsupportedKey is wrapped by every error that refuses a signing key for
// its type or size: only EC P-256 (ES256), RSA of MinRSAKeyBits to
// MaxRSAKeyBits bits (RS256) and Ed25519 (EdDSA) keys sign onboarding tokens.
var ErrUnsupportedKey = errors.New("unsupported signing key")

// signatureAlgorithms are the only algorithms a token header may name.
var signatureAlgorithms = []jose.SignatureAlgorithm{jose.ES256, jose.RS256, jose.EdDSA}

// Key is a signing key of the onboarding endpoint with its key ID and
// algorithm. A Key is immutable and safe for concurrent use.
type Key struct {
	id        string
	algorithm jose.SignatureAlgorithm
	private   crypto.Signer
	signer    jose.Signer
}

// NewKey wraps a private key: an *ecdsa.PrivateKey on P-256, an
// *rsa.PrivateKey of MinRSAKeyBits to MaxRSAKeyBits bits or an
// ed25519.PrivateKey. Other keys are refused with an error wrapping
// ErrUnsupportedKey. The key ID is the RFC 7638 SHA-256 thumbprint of the
// public key, base64url-encoded without padding.
func NewKey(private crypto.Signer) (*Key, error) {
	var alg jose.SignatureAlgorithm
	switch k := private.(type) {
	case *ecdsa.PrivateKey:
		if k == nil || k.Curve != elliptic.P256() {
			return nil, fmt.Errorf("%w: EC key on %s, want P-256", ErrUnsupportedKey, curveName(k))
		}
		alg = jose.ES256
	case *rsa.PrivateKey:
		if k == nil || k.N == nil {
			return nil, fmt.Errorf("%w: empty RSA key", ErrUnsupportedKey)
		}
		if bits := k.N.BitLen(); bits < MinRSAKeyBits || bits > MaxRSAKeyBits {
			return nil, fmt.Errorf("%w: RSA key of %d bits, want %d to %d", ErrUnsupportedKey, bits, MinRSAKeyBits, MaxRSAKeyBits)
		}
		if err := k.Validate(); err != nil {
			return nil, fmt.Errorf("invalid RSA key: %w", err)
		}
		alg = jose.RS256
	case ed25519.PrivateKey:
		if len(k) != ed25519.PrivateKeySize {
			return nil, fmt.Errorf("%w: Ed25519 key of %d bytes, want %d", ErrUnsupportedKey, len(k), ed25519.PrivateKeySize)
		}
		alg = jose.EdDSA
	case *ed25519.PrivateKey:
		if k == nil {
			return nil, fmt.Errorf("%w: nil Ed25519 key", ErrUnsupportedKey)
		}
		return NewKey(*k)
	default:
		return nil, fmt.Errorf("%w: %T", ErrUnsupportedKey, private)
	}
	thumb, err := (&jose.JSONWebKey{Key: private.Public()}).Thumbprint(crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("compute key thumbprint: %w", err)
	}
	id := base64.RawURLEncoding.EncodeToString(thumb)
	signer, err := jose.NewSigner(
		jose.SigningKey{Algorithm: alg, Key: jose.JSONWebKey{Key: private, KeyID: id}},
		(&jose.SignerOptions{}).WithType("JWT"),
	)
	if err != nil {
		return nil, fmt.Errorf("create %s signer: %w", alg, err)
	}
	return &Key{id: id, algorithm: alg, private: private, signer: signer}, nil
}

func curveName(k *ecdsa.PrivateKey) string {
	if k == nil || k.Curve == nil {
		return "no curve"
	}
	return k.Curve.Params().Name
}

// GenerateKey returns a fresh EC P-256 key, the kind EnsureKeySecret and
// Rotate create.
func GenerateKey() (*Key, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate P-256 key: %w", err)
	}
	return NewKey(k)
}

// ParseKeyPEM parses a private key from exactly one PEM block: "PRIVATE KEY"
// (PKCS#8), "EC PRIVATE KEY" (SEC 1) or "RSA PRIVATE KEY" (PKCS#1).
// Encrypted keys, public keys, certificates, several blocks and keys that
// NewKey refuses are refused.
func ParseKeyPEM(data []byte) (*Key, error) {
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block found")
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, fmt.Errorf("data after the %q PEM block: want exactly one private key", block.Type)
	}
	if _, encrypted := block.Headers["DEK-Info"]; encrypted {
		return nil, fmt.Errorf("%q PEM block is encrypted: store the key unencrypted", block.Type)
	}
	var (
		parsed any
		err    error
	)
	switch block.Type {
	case "PRIVATE KEY":
		parsed, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		parsed, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		parsed, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	case "ENCRYPTED PRIVATE KEY":
		return nil, errors.New(`"ENCRYPTED PRIVATE KEY" PEM block: store the key unencrypted`)
	default:
		return nil, fmt.Errorf(`PEM block of type %q: want "PRIVATE KEY", "EC PRIVATE KEY" or "RSA PRIVATE KEY"`, block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("parse %q PEM block: %w", block.Type, err)
	}
	signer, ok := parsed.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%w: %T", ErrUnsupportedKey, parsed)
	}
	return NewKey(signer)
}

// ID returns the key ID, the kid header of the tokens the key signs.
func (k *Key) ID() string { return k.id }

// Algorithm returns the JWS algorithm of the key: ES256, RS256 or EdDSA.
func (k *Key) Algorithm() jose.SignatureAlgorithm { return k.algorithm }

// Public returns the public key.
func (k *Key) Public() crypto.PublicKey { return k.private.Public() }

// MarshalPEM returns the private key as a PKCS#8 "PRIVATE KEY" PEM block.
func (k *Key) MarshalPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k.private)
	if err != nil {
		return nil, fmt.Errorf("marshal private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// KeySet is the current signing key and, after a rotation, the previous one.
// The current key signs; both verify. A KeySet is immutable.
type KeySet struct {
	current  *Key
	previous *Key
}

// NewKeySet returns a key set. current is required; previous may be nil. A
// previous key equal to the current one is dropped.
func NewKeySet(current, previous *Key) (*KeySet, error) {
	if current == nil {
		return nil, errors.New("key set without a current key")
	}
	if previous != nil && previous.id == current.id {
		previous = nil
	}
	return &KeySet{current: current, previous: previous}, nil
}

// Current returns the key that signs new tokens.
func (s *KeySet) Current() *Key { return s.current }

// Previous returns the key that signed tokens before the last rotation, or
// nil.
func (s *KeySet) Previous() *Key { return s.previous }

// lookup returns the key with the given ID, or nil.
func (s *KeySet) lookup(id string) *Key {
	switch {
	case id == "":
		return nil
	case s.current.id == id:
		return s.current
	case s.previous != nil && s.previous.id == id:
		return s.previous
	}
	return nil
}

// String lists the key IDs, for logs.
func (s *KeySet) String() string {
	if s.previous == nil {
		return fmt.Sprintf("current=%s(%s)", s.current.id, s.current.algorithm)
	}
	return fmt.Sprintf("current=%s(%s) previous=%s(%s)", s.current.id, s.current.algorithm, s.previous.id, s.previous.algorithm)
}
