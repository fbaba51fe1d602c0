package awstest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"strings"
	"time"

	"github.com/smallstep/pkcs7"
)

// CA is a demo region certificate and its key, standing in for AWS's
// RSA-2048 certificate of one region.
type CA struct {
	// Region is the region the certificate is meant for.
	Region string
	// Certificate is self-signed, RSA-2048, valid from an hour ago for ten
	// years.
	Certificate *x509.Certificate
	// Key is the certificate's private key.
	Key *rsa.PrivateKey
}

// NewCA generates a CA for region.
func NewCA(region string) (*CA, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("generate RSA key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, fmt.Errorf("generate serial: %w", err)
	}
	return newCAWithSubject(region, key, serial, pkix.Name{
		Country:      []string{"US"},
		Province:     []string{"Washington State"},
		Locality:     []string{"Seattle"},
		Organization: []string{"Embark test CA for " + region},
	})
}

// NewImpostorCA returns a CA with a new key whose certificate has the same
// subject, issuer and serial number as ca's: a signature made with it names
// ca's certificate as its signer but is not ca's.
func NewImpostorCA(ca *CA) (*CA, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("generate RSA key: %w", err)
	}
	return newCAWithSubject(ca.Region, key, ca.Certificate.SerialNumber, ca.Certificate.Subject)
}

func newCAWithSubject(region string, key *rsa.PrivateKey, serial *big.Int, subject pkix.Name) (*CA, error) {
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               subject,
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse certificate: %w", err)
	}
	return &CA{Region: region, Certificate: cert, Key: key}, nil
}

// CertificatePEM returns the certificate as PEM, as a <region>.pem file of a
// trust set directory holds it.
func (ca *CA) CertificatePEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Certificate.Raw})
}

// SignOptions varies how a document is signed, for negative tests.
type SignOptions struct {
	// EmbedCertificate encloses the CA's certificate in the PKCS#7, which
	// AWS does not do.
	EmbedCertificate bool
	// Detached leaves the content out of the PKCS#7.
	Detached bool
}

// Sign signs document as AWS signs the rsa2048 signature and returns it in
// IMDS's form: base64 with a line break every 76 characters.
func (ca *CA) Sign(document []byte) ([]byte, error) {
	der, err := ca.SignDER(document, SignOptions{})
	if err != nil {
		return nil, err
	}
	return EncodeSignature(der), nil
}

// SignDER signs document and returns the PKCS#7 SignedData DER.
func (ca *CA) SignDER(document []byte, opts SignOptions) ([]byte, error) {
	sd, err := pkcs7.NewSignedData(document)
	if err != nil {
		return nil, fmt.Errorf("new signed data: %w", err)
	}
	sd.SetDigestAlgorithm(pkcs7.OIDDigestAlgorithmSHA256)
	if err := sd.AddSigner(ca.Certificate, ca.Key, pkcs7.SignerInfoConfig{}); err != nil {
		return nil, fmt.Errorf("add signer: %w", err)
	}
	if opts.Detached {
		sd.Detach()
	}
	der, err := sd.Finish()
	if err != nil {
		return nil, fmt.Errorf("finish signed data: %w", err)
	}
	if opts.EmbedCertificate {
		return der, nil
	}
	return stripCertificates(der)
}

// EncodeSignature encodes DER as IMDS serves the rsa2048 signature.
func EncodeSignature(der []byte) []byte {
	enc := base64.StdEncoding.EncodeToString(der)
	var b strings.Builder
	for len(enc) > 76 {
		b.WriteString(enc[:76])
		b.WriteByte('\n')
		enc = enc[76:]
	}
	b.WriteString(enc)
	return []byte(b.String())
}

// stripCertificates removes the certificates ([0]) and CRLs ([1]) from a
// PKCS#7 SignedData, leaving everything else byte for byte.
func stripCertificates(der []byte) ([]byte, error) {
	var outer struct {
		ContentType asn1.ObjectIdentifier
		Content     asn1.RawValue
	}
	if _, err := asn1.Unmarshal(der, &outer); err != nil {
		return nil, fmt.Errorf("parse content info: %w", err)
	}
	var sd asn1.RawValue
	if _, err := asn1.Unmarshal(outer.Content.Bytes, &sd); err != nil {
		return nil, fmt.Errorf("parse signed data: %w", err)
	}
	var kept []byte
	for rest := sd.Bytes; len(rest) > 0; {
		var el asn1.RawValue
		var err error
		rest, err = asn1.Unmarshal(rest, &el)
		if err != nil {
			return nil, fmt.Errorf("parse signed data element: %w", err)
		}
		if el.Class == asn1.ClassContextSpecific && (el.Tag == 0 || el.Tag == 1) {
			continue
		}
		kept = append(kept, el.FullBytes...)
	}
	inner, err := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagSequence, IsCompound: true, Bytes: kept})
	if err != nil {
		return nil, fmt.Errorf("marshal signed data: %w", err)
	}
	outer.Content = asn1.RawValue{Class: asn1.ClassContextSpecific, Tag: 0, IsCompound: true, Bytes: inner}
	out, err := asn1.Marshal(outer)
	if err != nil {
		return nil, fmt.Errorf("marshal content info: %w", err)
	}
	return out, nil
}
