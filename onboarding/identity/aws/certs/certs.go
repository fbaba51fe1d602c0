// Package certs ships AWS's published RSA-2048 certificates that verify the
// RSA-2048 PKCS#7 signature of EC2 instance identity documents, one PEM file
// per region (<region>.pem), for the commercial, China, GovCloud and
// European Sovereign Cloud regions, with INDEX.tsv listing region, subject,
// notAfter and SHA-256 fingerprint of each.
//
// The set is taken from AWS's page "AWS public certificates for instance
// identity document signatures". AWS adds regions and may rotate
// certificates, so the set is only the default: [LoadDir] reads a
// replacement or extension from a directory of <region>.pem files.
package certs

import (
	"crypto/sha256"
	"crypto/x509"
	"embed"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
)

//go:embed *.pem INDEX.tsv
var embedded embed.FS

// FS returns the embedded data: one <region>.pem per region and INDEX.tsv.
func FS() fs.FS { return embedded }

// Default parses the embedded certificates, keyed by region.
func Default() (map[string]*x509.Certificate, error) {
	m, err := LoadDir(embedded)
	if err != nil {
		return nil, fmt.Errorf("load embedded AWS certificates: %w", err)
	}
	return m, nil
}

// LoadDirPath is [LoadDir] on the directory at dir on the local file system.
func LoadDirPath(dir string) (map[string]*x509.Certificate, error) {
	m, err := LoadDir(os.DirFS(dir))
	if err != nil {
		return nil, fmt.Errorf("load AWS certificates from %s: %w", dir, err)
	}
	return m, nil
}

// LoadDir reads every <region>.pem at the top level of fsys (other files are
// ignored) and returns the certificate of each, keyed by region. Each file
// must hold exactly one CERTIFICATE block and be named after a region.
func LoadDir(fsys fs.FS) (map[string]*x509.Certificate, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("read certificate directory: %w", err)
	}
	out := make(map[string]*x509.Certificate)
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || path.Ext(name) != ".pem" {
			continue
		}
		region := strings.TrimSuffix(name, ".pem")
		if !awswire.IsRegionName(region) {
			return nil, fmt.Errorf("certificate file %s: %q is not an AWS region name", name, region)
		}
		data, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("read certificate file %s: %w", name, err)
		}
		cert, err := ParsePEM(data)
		if err != nil {
			return nil, fmt.Errorf("certificate file %s: %w", name, err)
		}
		out[region] = cert
	}
	if len(out) == 0 {
		return nil, errors.New("no <region>.pem certificate files found")
	}
	return out, nil
}

// ParsePEM parses data holding exactly one PEM CERTIFICATE block.
func ParsePEM(data []byte) (*x509.Certificate, error) {
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	if block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("PEM block is %q, want CERTIFICATE", block.Type)
	}
	if extra, _ := pem.Decode(rest); extra != nil {
		return nil, errors.New("more than one PEM block")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse certificate: %w", err)
	}
	return cert, nil
}

// IndexEntry is one line of INDEX.tsv.
type IndexEntry struct {
	Region            string
	Subject           string
	NotAfter          string
	SHA256Fingerprint string // upper-case hex bytes separated by ':'
}

// Index parses the embedded INDEX.tsv, sorted by region.
func Index() ([]IndexEntry, error) {
	data, err := embedded.ReadFile("INDEX.tsv")
	if err != nil {
		return nil, fmt.Errorf("read INDEX.tsv: %w", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) < 2 || lines[0] != "region\tsubject\tnotAfter\tsha256_fingerprint" {
		return nil, errors.New("INDEX.tsv: unexpected header")
	}
	var out []IndexEntry
	for i, line := range lines[1:] {
		f := strings.Split(line, "\t")
		if len(f) != 4 {
			return nil, fmt.Errorf("INDEX.tsv line %d: %d fields, want 4", i+2, len(f))
		}
		out = append(out, IndexEntry{Region: f[0], Subject: f[1], NotAfter: f[2], SHA256Fingerprint: f[3]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Region < out[j].Region })
	return out, nil
}

// Fingerprint returns the SHA-256 fingerprint of cert's DER in the format of
// INDEX.tsv (upper-case hex bytes separated by ':').
func Fingerprint(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.Raw)
	parts := make([]string, len(sum))
	for i, b := range sum {
		parts[i] = fmt.Sprintf("%02X", b)
	}
	return strings.Join(parts, ":")
}
