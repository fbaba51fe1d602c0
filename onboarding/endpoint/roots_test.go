package endpoint

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
)

// selfSignedPEM returns a new self-signed CA certificate in PEM.
func selfSignedPEM(t *testing.T, cn string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestReadRootCertificates(t *testing.T) {
	dir := t.TempDir()
	ca1, ca2 := selfSignedPEM(t, "one"), selfSignedPEM(t, "two")
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name    string
		file    string
		wantErr bool
	}{
		{"one certificate", write("one.pem", ca1), false},
		{"a bundle", write("bundle.pem", append(append([]byte{}, ca1...), ca2...)), false},
		{"empty", write("empty.pem", nil), true},
		{"not PEM", write("garbage.pem", []byte("hello")), true},
		{"a key, not a certificate", write("key.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}})), true},
		{"a broken certificate", write("broken.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2, 3}})), true},
		{"missing", filepath.Join(dir, "missing.pem"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReadRootCertificates(tt.file)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if err == nil && len(got) == 0 {
				t.Fatal("no bytes returned")
			}
		})
	}
}

// The bootstrap carries the file's roots, follows a rotation, and keeps
// the last good roots while the file is broken.
func TestRootCertsFollowTheFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "root-cert.pem")
	r := &rootCerts{file: file}
	if _, err := r.get(); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file at first: err = %v, want not-exist", err)
	}
	ca1, ca2 := selfSignedPEM(t, "one"), selfSignedPEM(t, "two")
	for i, step := range []struct {
		write []byte
		want  []byte
	}{
		{write: ca1, want: ca1},
		{write: ca2, want: ca2},                 // rotated
		{write: []byte("truncated"), want: ca2}, // broken: last good kept
		{write: ca1, want: ca1},                 // fixed again
	} {
		if err := os.WriteFile(file, step.write, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := r.get()
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if !bytes.Equal(got, step.want) {
			t.Fatalf("step %d: got other roots", i)
		}
	}
	if got, _ := (&rootCerts{fixed: ca1}).get(); !bytes.Equal(got, ca1) {
		t.Fatal("fixed roots not returned")
	}
}

// A sidecar token renewal carries the roots of the file as it is now: a
// running VM learns a rotated serving CA from it without onboarding again.
func TestSidecarTokenRenewalCarriesTheCurrentRoots(t *testing.T) {
	file := filepath.Join(t.TempDir(), "roots.pem")
	ca1, ca2 := selfSignedPEM(t, "serving CA one"), selfSignedPEM(t, "serving CA two")
	if err := os.WriteFile(file, ca1, 0o600); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *Options) { o.Bootstrap.RootCertFile = file })
	h.apply(narrowPolicy)
	h.group("ratings", map[string]string{"app": "ratings"})
	auth, reg := h.registered(h.aws.IMDS, "172.31.5.254")
	if !bytes.Equal(reg.GetBootstrap().GetRootCertificates(), ca1) {
		t.Fatal("the bootstrap does not carry the file's roots")
	}
	renewCtx := session(t.Context(), auth.GetToken(), reg.GetSessionKey())
	for i, want := range [][]byte{ca1, append(append([]byte{}, ca1...), ca2...), ca2} {
		if err := os.WriteFile(file, want, 0o600); err != nil {
			t.Fatal(err)
		}
		res, err := h.client.RenewSidecarToken(renewCtx, &onboardingv1alpha1.RenewSidecarTokenRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(res.GetRootCertificates(), want) {
			t.Errorf("renewal %d: roots %q, want the file's", i, res.GetRootCertificates())
		}
	}
}
