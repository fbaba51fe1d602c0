package signing_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/ProtonMail/go-crypto/openpgp/clearsign"
	"github.com/ProtonMail/go-crypto/openpgp/packet"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

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

// armoredKey is a new private key of name whose keys live for lifetime (0:
// forever).
func armoredKey(t *testing.T, name string, lifetime time.Duration) ([]byte, time.Time) {
	t.Helper()
	created := time.Now().Truncate(time.Second)
	e, err := openpgp.NewEntity(name, "test", name+"@example.invalid", &packet.Config{
		Algorithm: packet.PubKeyAlgoEdDSA, KeyLifetimeSecs: uint32(lifetime / time.Second), Time: func() time.Time { return created },
	})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w, err := armor.Encode(&buf, openpgp.PrivateKeyType, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SerializePrivate(w, nil); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), created
}

// Expiry and the expiry gauge report when the signing key expires, and
// nothing for a key that does not.
func TestExpiry(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lifetime time.Duration
	}{
		{"expires in 30 days", 30 * 24 * time.Hour},
		{"expires in 2 days", 48 * time.Hour},
		{"never expires", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			priv, created := armoredKey(t, "repository", tc.lifetime)
			s, err := signing.New(priv)
			if err != nil {
				t.Fatal(err)
			}
			at, ok := s.Expiry()
			if want := tc.lifetime != 0; ok != want {
				t.Fatalf("Expiry ok %v, want %v", ok, want)
			}
			if ok && !at.Equal(created.Add(tc.lifetime)) {
				t.Errorf("Expiry %s, want %s", at, created.Add(tc.lifetime))
			}
			reg := prometheus.NewRegistry()
			if err := signing.RegisterExpiry(reg, func() *signing.Signer { return s }); err != nil {
				t.Fatal(err)
			}
			want := ""
			if ok {
				want = fmt.Sprintf("# HELP embark_repository_signing_key_expiry_timestamp_seconds When the local repository's OpenPGP signing key expires, in Unix seconds; absent for a key that does not expire.\n"+
					"# TYPE embark_repository_signing_key_expiry_timestamp_seconds gauge\nembark_repository_signing_key_expiry_timestamp_seconds %g\n", float64(at.Unix()))
			}
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
				t.Error(err)
			}
		})
	}
}
