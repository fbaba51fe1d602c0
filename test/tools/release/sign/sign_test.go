package sign

import (
	"crypto/elliptic"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sigstore/sigstore/pkg/cryptoutils"
)

// openssl runs openssl with args and returns its combined output.
func openssl(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	return exec.Command("openssl", args...).CombinedOutput()
}

// opensslKey has openssl write a private key and returns its PEM.
func opensslKey(t *testing.T, args ...string) []byte {
	t.Helper()
	out, err := openssl(t, args...)
	if err != nil {
		t.Fatalf("openssl %v: %v\n%s", args, err, out)
	}
	return out
}

// cosignKey is a key in the format `cosign generate-key-pair` writes
// (cosign calls the same cryptoutils function): PKCS #8 encrypted with
// scrypt and secretbox under password, PEM "ENCRYPTED SIGSTORE PRIVATE KEY".
func cosignKey(t *testing.T, password string) []byte {
	t.Helper()
	priv, _, err := cryptoutils.GeneratePEMEncodedECDSAKeyPair(elliptic.P256(), cryptoutils.StaticPasswordFunc([]byte(password)))
	if err != nil {
		t.Fatal(err)
	}
	return priv
}

// TestParseKey loads each key form cosign and OpenSSL write, signs with it
// and has openssl verify the signature against the public key Signer
// writes as cosign.pub; keys cosign cannot use are refused with a reason.
func TestParseKey(t *testing.T) {
	tests := []struct {
		name     string
		key      []byte
		password string
		wantErr  string
	}{
		{name: "openssl EC PRIVATE KEY", key: opensslKey(t, "ecparam", "-name", "prime256v1", "-genkey", "-noout")},
		{name: "openssl PKCS #8", key: opensslKey(t, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")},
		{name: "cosign encrypted", key: cosignKey(t, "s3cret"), password: "s3cret"},
		{name: "cosign encrypted, wrong password", key: cosignKey(t, "s3cret"), password: "guess", wantErr: "parse private key"},
		{name: "P-384", key: opensslKey(t, "ecparam", "-name", "secp384r1", "-genkey", "-noout"), wantErr: "want P-256"},
		{name: "RSA", key: opensslKey(t, "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"), wantErr: "want an ECDSA P-256 key"},
		{name: "public key", key: []byte("-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----\n"), wantErr: "parse private key"},
		{name: "not PEM", key: []byte("hunter2"), wantErr: "PEM decoding failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := ParseKey(tt.key, []byte(tt.password))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			file := filepath.Join(dir, "artifact")
			writeFile(t, file, []byte("a release file\n"))
			writeFile(t, filepath.Join(dir, "cosign.pub"), s.PublicKeyPEM())
			if err := s.SignFile(file); err != nil {
				t.Fatal(err)
			}
			if out, err := opensslVerify(t, dir, file); err != nil || strings.TrimSpace(string(out)) != "Verified OK" {
				t.Fatalf("openssl does not verify the signature: %v\n%s", err, out)
			}
			writeFile(t, file, []byte("a release file, changed\n"))
			if out, err := opensslVerify(t, dir, file); err == nil {
				t.Fatalf("openssl verifies the signature of a changed file:\n%s", out)
			}
		})
	}
}

// opensslVerify decodes file's base64 cosign signature to DER and runs
// `openssl dgst -sha256 -verify cosign.pub -signature <der> file`.
func opensslVerify(t *testing.T, dir, file string) ([]byte, error) {
	t.Helper()
	b64, err := os.ReadFile(file + ".sig")
	if err != nil {
		t.Fatal(err)
	}
	der, err := base64.StdEncoding.DecodeString(string(b64))
	if err != nil {
		t.Fatalf("signature is not base64: %v", err)
	}
	writeFile(t, file+".der", der)
	return openssl(t, "dgst", "-sha256", "-verify", filepath.Join(dir, "cosign.pub"), "-signature", file+".der", file)
}

// TestVerify checks Verify, the check cosign verify-blob makes, against
// a signature, a changed file and another key.
func TestVerify(t *testing.T) {
	s, err := ParseKey(opensslKey(t, "ecparam", "-name", "prime256v1", "-genkey", "-noout"), nil)
	if err != nil {
		t.Fatal(err)
	}
	other, err := ParseKey(opensslKey(t, "ecparam", "-name", "prime256v1", "-genkey", "-noout"), nil)
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("SHA256SUMS\n")
	der, err := s.Sign(data)
	if err != nil {
		t.Fatal(err)
	}
	sig := []byte(base64.StdEncoding.EncodeToString(der))
	if err := Verify(s.PublicKeyPEM(), data, sig); err != nil {
		t.Errorf("own signature: %v", err)
	}
	if err := Verify(s.PublicKeyPEM(), []byte("SHA256SUMS, changed\n"), sig); err == nil {
		t.Error("a changed file verifies")
	}
	if err := Verify(other.PublicKeyPEM(), data, sig); err == nil {
		t.Error("another key verifies the signature")
	}
}

// TestLoadOrGenerateKey generates the throwaway key once, private to its
// owner, and reuses it afterwards.
func TestLoadOrGenerateKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys", "release.key")
	first, generated, err := LoadOrGenerateKey(path)
	if err != nil || !generated {
		t.Fatalf("first call: generated %v, error %v", generated, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file %v, error %v; want mode 0600", fi.Mode(), err)
	}
	second, generated, err := LoadOrGenerateKey(path)
	if err != nil || generated {
		t.Fatalf("second call: generated %v, error %v", generated, err)
	}
	if string(first.PublicKeyPEM()) != string(second.PublicKeyPEM()) {
		t.Error("the second call has another key")
	}
}

// FuzzParseKey: any bytes and password give a key or an error, never a
// panic.
func FuzzParseKey(f *testing.F) {
	f.Add([]byte("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY-----\n"), []byte(""))
	f.Add([]byte("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\neyJrZGYiOnt9fQ==\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n"), []byte("pw"))
	f.Add([]byte("not a key"), []byte(nil))
	f.Fuzz(func(t *testing.T, key, password []byte) {
		s, err := ParseKey(key, password)
		if err == nil && len(s.PublicKeyPEM()) == 0 {
			t.Fatal("a key without a public key")
		}
	})
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}
