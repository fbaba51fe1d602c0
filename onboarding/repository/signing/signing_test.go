package signing_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/clearsign"

	"github.com/embark-mesh/embark/onboarding/repository/internal/pkgtest"
	"github.com/embark-mesh/embark/onboarding/repository/signing"
)

func TestSignAndVerify(t *testing.T) {
	priv, pub := pkgtest.Key(t, "repository")
	_, next := pkgtest.Key(t, "next")
	s, err := signing.New(priv, next, pub) // the signing key's own public key again: published once
	if err != nil {
		t.Fatal(err)
	}
	keys, err := openpgp.ReadArmoredKeyRing(bytes.NewReader(s.PublicKeys()))
	if err != nil || len(keys) != 2 {
		t.Fatalf("public keys: %d %v, want 2", len(keys), err)
	}
	for _, k := range keys {
		if k.PrivateKey != nil {
			t.Fatal("a private key is published")
		}
	}
	msg := []byte("Origin: Embark\nSuite: stable\n- a dash line\n")
	in, err := s.ClearSign(msg)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := clearsign.Decode(in)
	if b == nil || !bytes.Equal(b.Plaintext, bytes.TrimSuffix(msg, []byte("\n"))) && !bytes.Equal(b.Plaintext, msg) {
		t.Fatalf("clearsigned text: %q", in)
	}
	if signer, err := b.VerifySignature(keys, nil); err != nil || signer == nil {
		t.Fatalf("InRelease: %v", err)
	}
	sig, err := s.DetachSign(msg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := openpgp.CheckArmoredDetachedSignature(keys, bytes.NewReader(msg), bytes.NewReader(sig), nil); err != nil {
		t.Fatalf("detached: %v", err)
	}
	tampered := append(bytes.Clone(msg), 'x')
	if _, err := openpgp.CheckArmoredDetachedSignature(keys, bytes.NewReader(tampered), bytes.NewReader(sig), nil); err == nil {
		t.Fatal("a tampered message verifies")
	}
}

func TestNewRefuses(t *testing.T) {
	priv, pub := pkgtest.Key(t, "repository")
	other, _ := pkgtest.Key(t, "other")
	encrypted, _ := pkgtest.EncryptedKey(t, "encrypted", "secret")
	for _, tc := range []struct {
		name string
		key  []byte
		want error
	}{
		{"a public key", pub, signing.ErrNoSigningKey},
		{"passphrase-protected", encrypted, signing.ErrNoSigningKey},
		{"two keys", append(append(bytes.Clone(priv), '\n'), other...), signing.ErrNoSigningKey},
		{"not a key", []byte("-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nnope\n-----END PGP PRIVATE KEY BLOCK-----\n"), nil},
		{"empty", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := signing.New(tc.key)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("New: %v, want %v", err, tc.want)
			}
		})
	}
}
