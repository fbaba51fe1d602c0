// Package sign signs release files in cosign's blob format, so that
// `cosign verify-blob --key cosign.pub --signature <file>.sig <file>`
// verifies them offline: the signature is an ASN.1 DER ECDSA P-256
// signature over the file's SHA-256 digest, base64-encoded, and the public
// key is a PEM "PUBLIC KEY" block. sigstore/sigstore's signature and
// cryptoutils packages (what cosign itself uses) do the work; because the
// signature is plain ECDSA-SHA256, `openssl dgst -sha256 -verify cosign.pub
// -signature <der>` verifies it too.
package sign

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
)

// Signer signs files with one ECDSA P-256 key.
type Signer struct {
	sv  *signature.ECDSASignerVerifier
	pub []byte
}

// ParseKey reads a private key in one of the PEM forms cosign and OpenSSL
// write: "ENCRYPTED SIGSTORE PRIVATE KEY" or "ENCRYPTED COSIGN PRIVATE KEY"
// (`cosign generate-key-pair`, decrypted with password), "EC PRIVATE KEY"
// (`openssl ecparam -genkey`) or "PRIVATE KEY" (PKCS #8). The key must be
// ECDSA on P-256, the curve cosign's blob signatures use.
func ParseKey(pemBytes, password []byte) (*Signer, error) {
	priv, err := cryptoutils.UnmarshalPEMToPrivateKey(pemBytes, func(bool) ([]byte, error) { return password, nil })
	if err != nil {
		return nil, fmt.Errorf("parse private key: %w", err)
	}
	key, ok := priv.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("private key is %T, want an ECDSA P-256 key", priv)
	}
	if key.Curve != elliptic.P256() {
		return nil, fmt.Errorf("private key is on %s, want P-256", key.Curve.Params().Name)
	}
	sv, err := signature.LoadECDSASignerVerifier(key, crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("load signer: %w", err)
	}
	pub, err := cryptoutils.MarshalPublicKeyToPEM(key.Public())
	if err != nil {
		return nil, fmt.Errorf("marshal public key: %w", err)
	}
	return &Signer{sv: sv, pub: pub}, nil
}

// LoadKey reads the key file at path; password decrypts a cosign-format
// key (cosign reads it from COSIGN_PASSWORD).
func LoadKey(path string, password []byte) (*Signer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read signing key: %w", err)
	}
	s, err := ParseKey(data, password)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", path, err)
	}
	return s, nil
}

// LoadOrGenerateKey loads the unencrypted key at path, first generating a
// new P-256 key there (mode 0600) when the file does not exist. It reports
// whether it generated one.
func LoadOrGenerateKey(path string) (*Signer, bool, error) {
	_, err := os.Stat(path)
	if err == nil {
		s, err := LoadKey(path, nil)
		return s, false, err
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, fmt.Errorf("signing key: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, false, fmt.Errorf("generate signing key: %w", err)
	}
	pemBytes, err := cryptoutils.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return nil, false, fmt.Errorf("marshal signing key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, false, fmt.Errorf("signing key directory: %w", err)
	}
	if err := os.WriteFile(path, pemBytes, 0o600); err != nil {
		return nil, false, fmt.Errorf("write signing key: %w", err)
	}
	s, err := ParseKey(pemBytes, nil)
	return s, true, err
}

// PublicKeyPEM is the public key as cosign writes cosign.pub.
func (s *Signer) PublicKeyPEM() []byte { return bytes.Clone(s.pub) }

// Sign returns the DER ECDSA signature of data's SHA-256 digest.
func (s *Signer) Sign(data []byte) ([]byte, error) {
	sig, err := s.sv.SignMessage(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	return sig, nil
}

// SignFile writes path+".sig": the base64 signature of the file, as
// `cosign sign-blob --key ... --output-signature` writes it.
func (s *Signer) SignFile(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	sig, err := s.Sign(data)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := os.WriteFile(path+".sig", []byte(base64.StdEncoding.EncodeToString(sig)), 0o644); err != nil {
		return fmt.Errorf("write signature: %w", err)
	}
	return nil
}

// Verify checks a base64 signature of data with the public key in
// pubPEM, as `cosign verify-blob --key` does.
func Verify(pubPEM, data, sigBase64 []byte) error {
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(pubPEM)
	if err != nil {
		return fmt.Errorf("parse public key: %w", err)
	}
	ecPub, ok := pub.(*ecdsa.PublicKey)
	if !ok {
		return fmt.Errorf("public key is %T, want ECDSA", pub)
	}
	v, err := signature.LoadECDSAVerifier(ecPub, crypto.SHA256)
	if err != nil {
		return fmt.Errorf("load verifier: %w", err)
	}
	sig, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(sigBase64)))
	if err != nil {
		return fmt.Errorf("signature is not base64: %w", err)
	}
	if err := v.VerifySignature(bytes.NewReader(sig), bytes.NewReader(data)); err != nil {
		return fmt.Errorf("verify signature: %w", err)
	}
	return nil
}
