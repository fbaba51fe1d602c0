package assemble

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
)

// RepositoryKeyFile is the armored OpenPGP public key the DEB and RPM
// packages are signed with, under the name the endpoint's repository
// publishes it (docs/local-repository.md).
const RepositoryKeyFile = "repository.asc"

// writeRepositoryKey writes the public part of the armored OpenPGP private
// key the packages were signed with (`make packages`' signing key).
func writeRepositoryKey(privateKeyFile, out string) error {
	f, err := os.Open(privateKeyFile)
	if err != nil {
		return fmt.Errorf("package signing key: %w", err)
	}
	defer f.Close()
	entities, err := openpgp.ReadArmoredKeyRing(f)
	if err != nil {
		return fmt.Errorf("package signing key %s: %w", privateKeyFile, err)
	}
	var buf bytes.Buffer
	w, err := armor.Encode(&buf, openpgp.PublicKeyType, nil)
	if err != nil {
		return fmt.Errorf("armor public key: %w", err)
	}
	for _, e := range entities {
		if err := e.Serialize(w); err != nil {
			return fmt.Errorf("serialize public key: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("armor public key: %w", err)
	}
	buf.WriteByte('\n')
	if err := os.WriteFile(filepath.Join(out, RepositoryKeyFile), buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", RepositoryKeyFile, err)
	}
	return nil
}
