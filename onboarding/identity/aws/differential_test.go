package aws_test

import (
	"bytes"
	"crypto/x509"
	"encoding/asn1"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/smallstep/pkcs7"

	"github.com/embark-mesh/embark/onboarding/identity"
	awsid "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/identity/aws/certs"
)

// smallstepVerdict is the verification VerifyDocument made with
// smallstep/pkcs7 (BER converted to DER, then parsed and verified by the
// library), kept as the reference the package's own parser is compared
// with. It returns the refusal's reason, "" when the document verifies.
func smallstepVerdict(document, signature []byte, trust map[string]*x509.Certificate) (reason identity.Reason) {
	der, err := awsid.DecodeSignature(signature)
	if err != nil {
		return identity.ReasonOf(err)
	}
	p7, ok := smallstepParse(der)
	if !ok || len(p7.Signers) != 1 {
		return identity.ReasonMalformed
	}
	if len(p7.Content) == 0 || !bytes.Equal(p7.Content, document) {
		return identity.ReasonContentMismatch
	}
	doc, err := awsid.ParseDocument(document)
	if err != nil {
		return identity.ReasonOf(err)
	}
	cert, ok := trust[doc.Region]
	if !ok {
		return identity.ReasonUnknownRegion
	}
	strong := []asn1.ObjectIdentifier{pkcs7.OIDDigestAlgorithmSHA256, pkcs7.OIDDigestAlgorithmSHA384, pkcs7.OIDDigestAlgorithmSHA512}
	if !slices.ContainsFunc(strong, p7.Signers[0].DigestAlgorithm.Algorithm.Equal) {
		return identity.ReasonBadSignature
	}
	defer func() {
		if recover() != nil {
			reason = identity.ReasonBadSignature
		}
	}()
	p7.Certificates = []*x509.Certificate{cert}
	if p7.Verify() != nil {
		return identity.ReasonBadSignature
	}
	return ""
}

func smallstepParse(der []byte) (p7 *pkcs7.PKCS7, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	p7, err := pkcs7.Parse(der)
	return p7, err == nil
}

type differentialVector struct {
	name          string
	document, der []byte
	trust         map[string]*x509.Certificate
}

func differentialVectors(t *testing.T) []differentialVector {
	t.Helper()
	def, err := certs.Default()
	if err != nil {
		t.Fatal(err)
	}
	var vectors []differentialVector
	for _, s := range genuineSamples {
		doc, sig := readSample(t, s.dir, s.name)
		der, err := awsid.DecodeSignature(sig)
		if err != nil {
			t.Fatal(err)
		}
		vectors = append(vectors, differentialVector{name: s.name, document: doc, der: der, trust: def})
	}
	doc, sig := readSample(t, "negative", "vssm-us-east-1-BADSIG-negative")
	der, err := awsid.DecodeSignature(sig)
	if err != nil {
		t.Fatal(err)
	}
	vectors = append(vectors, differentialVector{name: "negative sample", document: doc, der: der, trust: def})

	ca := newCA(t, "us-east-2")
	trust := map[string]*x509.Certificate{"us-east-2": ca.Certificate}
	synth := awstest.Instance{Region: "us-east-2"}.Document()
	for name, opts := range map[string]awstest.SignOptions{
		"awstest DER":                   {},
		"awstest, certificate enclosed": {EmbedCertificate: true},
		"awstest, detached":             {Detached: true},
	} {
		vectors = append(vectors, differentialVector{name: name, document: synth, der: signDER(t, ca, synth, opts), trust: trust})
	}
	return vectors
}

// TestParserAgreesWithSmallstep compares VerifyDocument with the reference
// verification by smallstep/pkcs7 over the genuine and synthetic
// signatures and every one-byte alteration of them (each octet's lowest
// and highest bit flipped). Both accept the unaltered signatures; of the
// alterations, VerifyDocument accepts only what the reference accepts and
// refuses the rest with the reference's reason, or as malformed where it
// reads the encoding more strictly.
func TestParserAgreesWithSmallstep(t *testing.T) {
	for _, vec := range differentialVectors(t) {
		t.Run(vec.name, func(t *testing.T) {
			v, err := awsid.NewVerifier("differential.example.com", awsid.WithTrustedCertificates(vec.trust))
			if err != nil {
				t.Fatal(err)
			}
			compare := func(what string, der []byte) bool {
				sig := awstest.EncodeSignature(der)
				_, err := v.VerifyDocument(vec.document, sig)
				got, want := identity.ReasonOf(err), smallstepVerdict(vec.document, sig, vec.trust)
				if err != nil && got == "" {
					t.Errorf("%s: refusal without a reason: %v", what, err)
				}
				switch got {
				case want:
					return true
				case identity.ReasonMalformed:
					// A stricter reading of the encoding: refused as
					// malformed where the reference read on (its BER
					// conversion skips over wrong lengths, it takes the
					// bytes of any element as the content, it refuses a
					// signer's malformed field at a later check).
					t.Logf("%s: refused as malformed (%v), smallstep reference %q", what, err, want)
					return true
				default:
					t.Errorf("%s: VerifyDocument reason %q (%v), smallstep reference %q", what, got, err, want)
					return false
				}
			}
			sig := awstest.EncodeSignature(vec.der)
			if _, err := v.VerifyDocument(vec.document, sig); identity.ReasonOf(err) != smallstepVerdict(vec.document, sig, vec.trust) {
				t.Fatalf("unaltered: VerifyDocument error %v, smallstep reference %q", err, smallstepVerdict(vec.document, sig, vec.trust))
			}
			mismatches := 0
			for i := range vec.der {
				for _, bit := range []byte{0x01, 0x80} {
					altered := bytes.Clone(vec.der)
					altered[i] ^= bit
					if !compare(fmt.Sprintf("octet %d ^ 0x%02x", i, bit), altered) {
						if mismatches++; mismatches > 10 {
							t.Fatal("too many mismatches")
						}
					}
				}
			}
		})
	}
}

// DecodeSignature reads the base64 signature however its lines are broken
// or indented, and refuses what is not base64.
func TestDecodeSignatureWhitespace(t *testing.T) {
	der := signDER(t, newCA(t, "us-east-2"), awstest.Instance{}.Document(), awstest.SignOptions{})
	lines := string(awstest.EncodeSignature(der))
	tests := []struct {
		name    string
		sig     string
		wantErr bool
	}{
		{name: "IMDS form, LF line breaks", sig: lines},
		{name: "CRLF line breaks", sig: strings.ReplaceAll(lines, "\n", "\r\n")},
		{name: "one line, trailing newline", sig: strings.ReplaceAll(lines, "\n", "") + "\n"},
		{name: "indented lines", sig: "  " + strings.ReplaceAll(lines, "\n", "\n\t ")},
		{name: "a stray character", sig: lines[:40] + "!" + lines[40:], wantErr: true},
		{name: "truncated", sig: lines[:len(lines)-3], wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := awsid.DecodeSignature([]byte(tt.sig))
			if tt.wantErr {
				if identity.ReasonOf(err) != identity.ReasonMalformed {
					t.Fatalf("DecodeSignature() error = %v, want a Malformed refusal", err)
				}
				return
			}
			if err != nil || !bytes.Equal(got, der) {
				t.Fatalf("DecodeSignature() = %d bytes, %v; want the %d-byte DER", len(got), err, len(der))
			}
		})
	}
}
