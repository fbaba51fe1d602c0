// Package signing signs the local repository's metadata with an OpenPGP
// key, as apt and dnf verify it: a clear-signed InRelease, detached
// armored signatures (Release.gpg, repomd.xml.asc), and the armored public
// keys a VM trusts. The key is the operator's (a file, from a Secret in the
// cluster); nothing here generates one. It uses ProtonMail's go-crypto
// OpenPGP implementation, the one nfpm signs the packages with.
package signing

import (
	"bytes"
	"crypto"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/ProtonMail/go-crypto/openpgp/clearsign"
	"github.com/ProtonMail/go-crypto/openpgp/packet"
)

// Signer signs with one private key and publishes its public key together
// with any others (a key being rotated in or out).
type Signer struct {
	entity *openpgp.Entity
	key    *packet.PrivateKey
	public []byte
	now    func() time.Time
}

// ErrNoSigningKey means the key file holds no usable private signing key.
var ErrNoSigningKey = errors.New("no private signing key")

// New reads the armored private key (exactly one, not passphrase-protected,
// able to sign now) and the armored public keys published beside it.
func New(privateKey []byte, published ...[]byte) (*Signer, error) {
	if n := bytes.Count(privateKey, []byte("-----BEGIN PGP ")); n > 1 {
		return nil, fmt.Errorf("read the signing key: %d armored blocks, want exactly one key: %w", n, ErrNoSigningKey)
	}
	keys, err := openpgp.ReadArmoredKeyRing(bytes.NewReader(privateKey))
	if err != nil {
		return nil, fmt.Errorf("read the signing key: %w", err)
	}
	if len(keys) != 1 {
		return nil, fmt.Errorf("read the signing key: %d keys, want exactly one: %w", len(keys), ErrNoSigningKey)
	}
	s := &Signer{entity: keys[0], now: time.Now}
	k, ok := s.entity.SigningKey(s.now())
	if !ok || k.PrivateKey == nil {
		return nil, fmt.Errorf("key %s: %w (expired, revoked, or a public key)", fingerprint(s.entity), ErrNoSigningKey)
	}
	if k.PrivateKey.Encrypted {
		return nil, fmt.Errorf("key %s is passphrase-protected: store it without a passphrase (the Secret protects it): %w", fingerprint(s.entity), ErrNoSigningKey)
	}
	s.key = k.PrivateKey

	ring := openpgp.EntityList{s.entity}
	seen := map[string]bool{fingerprint(s.entity): true}
	for i, p := range published {
		extra, err := openpgp.ReadArmoredKeyRing(bytes.NewReader(p))
		if err != nil {
			return nil, fmt.Errorf("read published public keys %d: %w", i+1, err)
		}
		for _, e := range extra {
			if fp := fingerprint(e); !seen[fp] {
				seen[fp] = true
				ring = append(ring, e)
			}
		}
	}
	var buf bytes.Buffer
	w, err := armor.Encode(&buf, openpgp.PublicKeyType, nil)
	if err != nil {
		return nil, fmt.Errorf("armor the public keys: %w", err)
	}
	for _, e := range ring {
		if err := e.Serialize(w); err != nil { // public parts only
			return nil, fmt.Errorf("export public key %s: %w", fingerprint(e), err)
		}
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("armor the public keys: %w", err)
	}
	buf.WriteByte('\n')
	s.public = buf.Bytes()
	return s, nil
}

// Expiry is when the signing key stops being able to sign: the earlier of
// the primary key's expiry and, when a subkey signs, the subkey's (each its
// creation time plus the lifetime its self-signature states); ok is false
// when neither expires.
func (s *Signer) Expiry() (expiry time.Time, ok bool) {
	earliest := func(created time.Time, sig *packet.Signature) {
		if sig == nil || sig.KeyLifetimeSecs == nil || *sig.KeyLifetimeSecs == 0 {
			return
		}
		t := created.Add(time.Duration(*sig.KeyLifetimeSecs) * time.Second)
		if !ok || t.Before(expiry) {
			expiry, ok = t, true
		}
	}
	primary := s.entity.PrimaryKey
	if id := s.entity.PrimaryIdentity(); id != nil {
		earliest(primary.CreationTime, id.SelfSignature)
	}
	earliest(primary.CreationTime, s.entity.SelfSignature)
	for _, sub := range s.entity.Subkeys {
		if sub.PrivateKey == s.key {
			earliest(sub.PublicKey.CreationTime, sub.Sig)
		}
	}
	return expiry, ok
}

// Fingerprint is the signing key's primary key fingerprint, upper-case hex
// as gpg prints it.
func (s *Signer) Fingerprint() string { return fingerprint(s.entity) }

// PublicKeys is the armored public key block a VM trusts: the signing key's
// and every published one.
func (s *Signer) PublicKeys() []byte { return bytes.Clone(s.public) }

func (s *Signer) config() *packet.Config {
	return &packet.Config{DefaultHash: crypto.SHA256, Time: s.now}
}

// ClearSign returns msg clear-signed (an InRelease file).
func (s *Signer) ClearSign(msg []byte) ([]byte, error) {
	var buf bytes.Buffer
	w, err := clearsign.Encode(&buf, s.key, s.config())
	if err != nil {
		return nil, fmt.Errorf("clearsign: %w", err)
	}
	if _, err := w.Write(msg); err != nil {
		return nil, fmt.Errorf("clearsign: %w", err)
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("clearsign: %w", err)
	}
	return buf.Bytes(), nil
}

// DetachSign returns an armored detached binary signature of msg
// (Release.gpg, repomd.xml.asc).
func (s *Signer) DetachSign(msg []byte) ([]byte, error) {
	var buf bytes.Buffer
	if err := openpgp.ArmoredDetachSign(&buf, s.entity, bytes.NewReader(msg), s.config()); err != nil {
		return nil, fmt.Errorf("detach sign: %w", err)
	}
	buf.WriteByte('\n')
	return buf.Bytes(), nil
}

func fingerprint(e *openpgp.Entity) string {
	return strings.ToUpper(fmt.Sprintf("%x", e.PrimaryKey.Fingerprint))
}
