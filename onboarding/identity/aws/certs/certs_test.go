package certs

import (
	"crypto/rsa"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

func TestEmbeddedCertificatesMatchIndex(t *testing.T) {
	index, err := Index()
	if err != nil {
		t.Fatal(err)
	}
	set, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	if len(index) != len(set) {
		t.Fatalf("INDEX.tsv has %d regions, %d certificates are embedded", len(index), len(set))
	}
	if len(set) < 39 {
		t.Errorf("only %d regions embedded, want at least 39", len(set))
	}
	keys := map[string]string{}
	for _, e := range index {
		t.Run(e.Region, func(t *testing.T) {
			cert, ok := set[e.Region]
			if !ok {
				t.Fatalf("no certificate for %s", e.Region)
			}
			if got := Fingerprint(cert); got != e.SHA256Fingerprint {
				t.Errorf("fingerprint %s, INDEX.tsv says %s", got, e.SHA256Fingerprint)
			}
			pub, ok := cert.PublicKey.(*rsa.PublicKey)
			if !ok {
				t.Fatalf("public key is %T, want RSA", cert.PublicKey)
			}
			if pub.N.BitLen() != 2048 {
				t.Errorf("RSA key of %d bits, want 2048", pub.N.BitLen())
			}
			if !strings.Contains(e.Subject, "Amazon Web Services LLC") {
				t.Errorf("INDEX subject %q", e.Subject)
			}
			// AWS's certificates are v1 (no CA extensions): check the
			// self-signature directly.
			if err := cert.CheckSignature(cert.SignatureAlgorithm, cert.RawTBSCertificate, cert.Signature); err != nil {
				t.Errorf("not self-signed (%v): %v", cert.SignatureAlgorithm, err)
			}
			if other, dup := keys[pub.N.String()]; dup {
				t.Errorf("same key as %s", other)
			}
			keys[pub.N.String()] = e.Region
		})
	}
}

func TestPartitionsCovered(t *testing.T) {
	set, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, region := range []string{"us-east-1", "cn-north-1", "cn-northwest-1", "us-gov-west-1", "us-gov-east-1", "eusc-de-east-1"} {
		if _, ok := set[region]; !ok {
			t.Errorf("no certificate for %s", region)
		}
	}
}

func TestLoadDir(t *testing.T) {
	good, err := embedded.ReadFile("us-east-1.pem")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		files       fstest.MapFS
		wantRegions []string
		wantErr     string
	}{
		{
			name:        "one region, other files ignored",
			files:       fstest.MapFS{"xx-test-1.pem": {Data: good}, "README.md": {Data: []byte("hi")}},
			wantRegions: []string{"xx-test-1"},
		},
		{name: "empty", files: fstest.MapFS{}, wantErr: "no <region>.pem"},
		{name: "not a region", files: fstest.MapFS{"ca.pem": {Data: good}}, wantErr: "not an AWS region name"},
		{name: "not PEM", files: fstest.MapFS{"us-east-1.pem": {Data: []byte("garbage")}}, wantErr: "no PEM block"},
		{name: "wrong block", files: fstest.MapFS{"us-east-1.pem": {Data: []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")}}, wantErr: "want CERTIFICATE"},
		{name: "two blocks", files: fstest.MapFS{"us-east-1.pem": {Data: append(append([]byte{}, good...), good...)}}, wantErr: "more than one PEM block"},
		{name: "bad DER", files: fstest.MapFS{"us-east-1.pem": {Data: []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")}}, wantErr: "parse certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := LoadDir(tt.files)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("LoadDir() error = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.wantRegions) {
				t.Fatalf("got %d regions, want %v", len(got), tt.wantRegions)
			}
			for _, r := range tt.wantRegions {
				if got[r] == nil {
					t.Errorf("missing %s", r)
				}
			}
		})
	}
}

func TestLoadDirPath(t *testing.T) {
	dir := t.TempDir()
	data, err := embedded.ReadFile("eu-west-1.pem")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "eu-west-1.pem"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LoadDirPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got["eu-west-1"] == nil {
		t.Fatal("eu-west-1 not loaded")
	}
	if _, err := LoadDirPath(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("LoadDirPath on a missing directory succeeded")
	}
}
