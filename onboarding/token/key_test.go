package token_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/embark-mesh/embark/onboarding/token"
)

func TestParseKeyPEM(t *testing.T) {
	ec := ecKey(t)
	ecSEC1, err := x509.MarshalECPrivateKey(ec)
	if err != nil {
		t.Fatal(err)
	}
	rsa2048 := rsaKey(t, 0)
	ed := edKey(t)
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p384SEC1, err := x509.MarshalECPrivateKey(p384)
	if err != nil {
		t.Fatal(err)
	}
	rsa1024, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(ec.Public())
	if err != nil {
		t.Fatal(err)
	}
	encrypted := pem.EncodeToMemory(&pem.Block{
		Type:    "EC PRIVATE KEY",
		Headers: map[string]string{"Proc-Type": "4,ENCRYPTED", "DEK-Info": "AES-256-CBC,00112233445566778899AABBCCDDEEFF"},
		Bytes:   ecSEC1,
	})

	tests := []struct {
		name            string
		pem             []byte
		wantAlg         jose.SignatureAlgorithm
		wantErr         string
		wantUnsupported bool
	}{
		{name: "EC P-256 PKCS#8", pem: pkcs8(t, ec), wantAlg: jose.ES256},
		{name: "EC P-256 SEC 1", pem: pemOf(t, "EC PRIVATE KEY", ecSEC1), wantAlg: jose.ES256},
		{name: "RSA 2048 PKCS#1", pem: pemOf(t, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsa2048)), wantAlg: jose.RS256},
		{name: "RSA 2048 PKCS#8", pem: pkcs8(t, rsa2048), wantAlg: jose.RS256},
		{name: "Ed25519 PKCS#8", pem: pkcs8(t, ed), wantAlg: jose.EdDSA},
		{name: "with surrounding whitespace", pem: append(append([]byte("\n\n"), pkcs8(t, ec)...), "\n  \n"...), wantAlg: jose.ES256},
		{name: "EC P-384 PKCS#8", pem: pkcs8(t, p384), wantErr: "P-384", wantUnsupported: true},
		{name: "EC P-384 SEC 1", pem: pemOf(t, "EC PRIVATE KEY", p384SEC1), wantErr: "P-384", wantUnsupported: true},
		{name: "RSA 1024", pem: pemOf(t, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsa1024)), wantErr: "1024 bits", wantUnsupported: true},
		{name: "legacy encrypted PEM", pem: encrypted, wantErr: "encrypted"},
		{name: "PKCS#8 encrypted", pem: pemOf(t, "ENCRYPTED PRIVATE KEY", []byte{1, 2, 3}), wantErr: "unencrypted"},
		{name: "public key", pem: pemOf(t, "PUBLIC KEY", pubDER), wantErr: `"PUBLIC KEY"`},
		{name: "certificate", pem: pemOf(t, "CERTIFICATE", []byte{0x30, 0x00}), wantErr: `"CERTIFICATE"`},
		{name: "SEC 1 label on PKCS#8 content", pem: pemOf(t, "EC PRIVATE KEY", []byte{0x30, 0x03, 0x02, 0x01, 0x00}), wantErr: "parse"},
		{name: "garbage DER", pem: pemOf(t, "PRIVATE KEY", []byte("garbage")), wantErr: "parse"},
		{name: "two keys", pem: append(pkcs8(t, ec), pkcs8(t, ed)...), wantErr: "exactly one"},
		{name: "not PEM", pem: []byte("hello"), wantErr: "no PEM block"},
		{name: "empty", pem: nil, wantErr: "no PEM block"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := token.ParseKeyPEM(tt.pem)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseKeyPEM() error = %v, want one containing %q", err, tt.wantErr)
				}
				if got := errors.Is(err, token.ErrUnsupportedKey); got != tt.wantUnsupported {
					t.Errorf("errors.Is(err, ErrUnsupportedKey) = %v, want %v (err %v)", got, tt.wantUnsupported, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseKeyPEM() error = %v", err)
			}
			if k.Algorithm() != tt.wantAlg {
				t.Errorf("Algorithm() = %s, want %s", k.Algorithm(), tt.wantAlg)
			}
			// MarshalPEM round-trips to the same key.
			out, err := k.MarshalPEM()
			if err != nil {
				t.Fatal(err)
			}
			again, err := token.ParseKeyPEM(out)
			if err != nil {
				t.Fatalf("parse MarshalPEM output: %v", err)
			}
			if again.ID() != k.ID() {
				t.Errorf("key ID after MarshalPEM = %s, want %s", again.ID(), k.ID())
			}
		})
	}
}

func TestNewKeyRefusesUnsupported(t *testing.T) {
	p521, err := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		key     crypto.Signer
		wantErr string
	}{
		{name: "P-521", key: p521, wantErr: "P-521"},
		{name: "nil ECDSA", key: (*ecdsa.PrivateKey)(nil), wantErr: "no curve"},
		{name: "short Ed25519", key: ed25519.PrivateKey{1, 2, 3}, wantErr: "3 bytes"},
		{name: "nil Ed25519 pointer", key: (*ed25519.PrivateKey)(nil), wantErr: "nil Ed25519"},
		{name: "other signer", key: otherSigner{}, wantErr: "token_test.otherSigner"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := token.NewKey(tt.key)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, token.ErrUnsupportedKey) {
				t.Errorf("NewKey() error = %v, want ErrUnsupportedKey containing %q", err, tt.wantErr)
			}
		})
	}
}

type otherSigner struct{}

func (otherSigner) Public() crypto.PublicKey { return nil }
func (otherSigner) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) {
	return nil, errors.New("not a key")
}

// The key ID is the RFC 7638 thumbprint, computed here independently of
// go-jose from the canonical JWK members in lexicographic order.
func TestKeyIDIsRFC7638Thumbprint(t *testing.T) {
	ec := ecKey(t)
	ed := edKey(t)
	rsaK := rsaKey(t, 0)
	b64 := base64.RawURLEncoding.EncodeToString
	ecBytes, err := ec.PublicKey.Bytes() // 0x04 || X || Y
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		key       *token.Key
		wantInput string
	}{
		{
			name:      "EC P-256",
			key:       mustKey(t, ec),
			wantInput: `{"crv":"P-256","kty":"EC","x":"` + b64(ecBytes[1:33]) + `","y":"` + b64(ecBytes[33:]) + `"}`,
		},
		{
			name:      "Ed25519",
			key:       mustKey(t, ed),
			wantInput: `{"crv":"Ed25519","kty":"OKP","x":"` + b64(ed.Public().(ed25519.PublicKey)) + `"}`,
		},
		{
			name:      "RSA",
			key:       mustKey(t, rsaK),
			wantInput: `{"e":"` + b64([]byte{0x01, 0x00, 0x01}) + `","kty":"RSA","n":"` + b64(rsaK.N.Bytes()) + `"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sum := sha256.Sum256([]byte(tt.wantInput))
			if want := b64(sum[:]); tt.key.ID() != want {
				t.Errorf("ID() = %s, want %s", tt.key.ID(), want)
			}
		})
	}
}

func TestNewKeySet(t *testing.T) {
	a, b := mustKey(t, ecKey(t)), mustKey(t, ecKey(t))
	tests := []struct {
		name         string
		current      *token.Key
		previous     *token.Key
		wantErr      bool
		wantPrevious *token.Key
	}{
		{name: "current only", current: a},
		{name: "current and previous", current: a, previous: b, wantPrevious: b},
		{name: "previous equal to current is dropped", current: a, previous: a},
		{name: "no current", previous: b, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := token.NewKeySet(tt.current, tt.previous)
			if (err != nil) != tt.wantErr {
				t.Fatalf("NewKeySet() error = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if s.Current() != tt.current || s.Previous() != tt.wantPrevious {
				t.Errorf("key set = %v, want current %s previous %v", s, tt.current.ID(), tt.wantPrevious)
			}
		})
	}
}

func TestLoadStaticKeySource(t *testing.T) {
	dir := t.TempDir()
	cur, prev := ecKey(t), edKey(t)
	curFile, prevFile, badFile := filepath.Join(dir, "current.pem"), filepath.Join(dir, "previous.pem"), filepath.Join(dir, "bad.pem")
	for file, data := range map[string][]byte{curFile: pkcs8(t, cur), prevFile: pkcs8(t, prev), badFile: []byte("bad")} {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name         string
		current      string
		previous     string
		wantErr      string
		wantCurrent  string
		wantPrevious string
	}{
		{name: "current only", current: curFile, wantCurrent: mustKey(t, cur).ID()},
		{name: "current and previous", current: curFile, previous: prevFile, wantCurrent: mustKey(t, cur).ID(), wantPrevious: mustKey(t, prev).ID()},
		{name: "missing file", current: filepath.Join(dir, "nope.pem"), wantErr: "no such file"},
		{name: "bad previous", current: curFile, previous: badFile, wantErr: "bad.pem"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, err := token.LoadStaticKeySource(tt.current, tt.previous)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			set := src.KeySet()
			if set.Current().ID() != tt.wantCurrent {
				t.Errorf("current = %s, want %s", set.Current().ID(), tt.wantCurrent)
			}
			var gotPrev string
			if set.Previous() != nil {
				gotPrev = set.Previous().ID()
			}
			if gotPrev != tt.wantPrevious {
				t.Errorf("previous = %q, want %q", gotPrev, tt.wantPrevious)
			}
		})
	}
}
