package aws_test

import (
	"bytes"
	"crypto/x509"
	"encoding/asn1"
	"fmt"
	"slices"
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
	// enclosed is the certificate enclosed in der, if any.
	enclosed []byte
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
		vec := differentialVector{name: name, document: synth, der: signDER(t, ca, synth, opts), trust: trust}
		if opts.EmbedCertificate {
			vec.enclosed = ca.Certificate.Raw
		}
		vectors = append(vectors, vec)
	}
	return vectors
}

// TestParserAgreesWithSmallstep compares VerifyDocument with the reference
// verification by smallstep/pkcs7 over the genuine and synthetic
// signatures and every one-byte alteration of them (each octet's lowest
// and highest bit flipped). VerifyDocument accepts nothing the reference
// refuses; it refuses what the reference accepts only as malformed (an
// encoding read more strictly: lengths, trailing data); both refuse the
// rest with the same reason, except where one of them finds the encoding
// malformed and the other refuses at a later check.
func TestParserAgreesWithSmallstep(t *testing.T) {
	for _, vec := range differentialVectors(t) {
		t.Run(vec.name, func(t *testing.T) {
			v, err := awsid.NewVerifier("differential.example.com", awsid.WithTrustedCertificates(vec.trust))
			if err != nil {
				t.Fatal(err)
			}
			certAt := -1
			if vec.enclosed != nil {
				certAt = bytes.Index(vec.der, vec.enclosed)
			}
			// The certificates field: its [0] header (four octets) and the
			// certificate.
			inCertificate := func(i int) bool { return certAt >= 0 && i >= certAt-4 && i < certAt+len(vec.enclosed) }
			compare := func(what string, der []byte, i int) bool {
				sig := awstest.EncodeSignature(der)
				_, err := v.VerifyDocument(vec.document, sig)
				got, want := identity.ReasonOf(err), smallstepVerdict(vec.document, sig, vec.trust)
				if err != nil && got == "" {
					t.Errorf("%s: refusal without a reason: %v", what, err)
				}
				switch {
				case got == want:
					return true
				case got == "" && want == identity.ReasonMalformed && inCertificate(i):
					// Enclosed certificates are discarded by both; crypto/x509
					// parses a few alterations of the field that the
					// reference's encoding/asn1 reading refuses.
					t.Logf("%s (in the enclosed certificate): accepted, smallstep reference %q", what, want)
					return true
				case got == "" || want == "" && got != identity.ReasonMalformed:
					t.Errorf("%s: VerifyDocument reason %q (%v), smallstep reference %q", what, got, err, want)
					return false
				case got == identity.ReasonMalformed || want == identity.ReasonMalformed:
					// Both refuse a corrupted encoding: one reads it more
					// strictly (Malformed) than the other, which goes on
					// to a later check.
					t.Logf("%s: VerifyDocument reason %q (%v), smallstep reference %q", what, got, err, want)
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
					if !compare(fmt.Sprintf("octet %d ^ 0x%02x", i, bit), altered, i) {
						if mismatches++; mismatches > 10 {
							t.Fatal("too many mismatches")
						}
					}
				}
			}
		})
	}
}
