package aws_test

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/smallstep/pkcs7"

	"github.com/embark-mesh/embark/onboarding/identity"
	awsid "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/onboarding/identity/aws/certs"
)

func newCA(t *testing.T, region string) *awstest.CA {
	t.Helper()
	ca, err := awstest.NewCA(region)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func signDER(t *testing.T, ca *awstest.CA, doc []byte, opts awstest.SignOptions) []byte {
	t.Helper()
	der, err := ca.SignDER(doc, opts)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func flipByte(b []byte, i int) []byte {
	out := bytes.Clone(b)
	out[i] ^= 0x01
	return out
}

func TestVerifyDocumentRefusals(t *testing.T) {
	ca := newCA(t, "us-east-2")
	other := newCA(t, "us-east-2")
	impostor, err := awstest.NewImpostorCA(ca)
	if err != nil {
		t.Fatal(err)
	}
	inst := awstest.Instance{Region: "us-east-2"}
	doc := inst.Document()
	der := signDER(t, ca, doc, awstest.SignOptions{})
	docAt := bytes.Index(der, doc)
	if docAt < 0 {
		t.Fatal("document not found in the signature's DER")
	}

	// A document whose content was altered in the signature and in the
	// submitted copy alike: the signed digest no longer matches.
	alteredDoc := flipByte(doc, bytes.Index(doc, []byte("i-1234567890abcdef0"))+2)
	alteredBoth := bytes.Clone(der)
	copy(alteredBoth[docAt:], alteredDoc)

	twoSigners := func() []byte {
		sd, err := pkcs7.NewSignedData(doc)
		if err != nil {
			t.Fatal(err)
		}
		sd.SetDigestAlgorithm(pkcs7.OIDDigestAlgorithmSHA256)
		for _, c := range []*awstest.CA{ca, other} {
			if err := sd.AddSigner(c.Certificate, c.Key, pkcs7.SignerInfoConfig{}); err != nil {
				t.Fatal(err)
			}
		}
		out, err := sd.Finish()
		if err != nil {
			t.Fatal(err)
		}
		return out
	}()

	sha1Signed := func() []byte {
		sd, err := pkcs7.NewSignedData(doc)
		if err != nil {
			t.Fatal(err)
		}
		sd.SetDigestAlgorithm(pkcs7.OIDDigestAlgorithmSHA1)
		if err := sd.AddSigner(ca.Certificate, ca.Key, pkcs7.SignerInfoConfig{}); err != nil {
			t.Fatal(err)
		}
		out, err := sd.Finish()
		if err != nil {
			t.Fatal(err)
		}
		return out
	}()

	otherDoc := awstest.Instance{Region: "us-east-2", InstanceID: "i-0aaaaaaaaaaaaaaaa"}.Document()
	badAccountDoc := []byte(`{"accountId":"12","instanceId":"i-1234567890abcdef0","region":"us-east-2","availabilityZone":"us-east-2b"}`)
	unknownRegionDoc := awstest.Instance{Region: "xx-test-1"}.Document()
	oldDoc := awstest.Instance{Region: "us-east-2", PendingTime: time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)}.Document()

	tests := []struct {
		name       string
		trust      map[string]*x509.Certificate // default: {us-east-2: ca}
		doc        []byte
		sig        []byte
		wantReason identity.Reason
	}{
		{name: "valid", doc: doc, sig: awstest.EncodeSignature(der)},
		{name: "valid, PEM", doc: doc, sig: pem.EncodeToMemory(&pem.Block{Type: "PKCS7", Bytes: der})},
		{name: "valid, own certificate enclosed", doc: doc, sig: awstest.EncodeSignature(signDER(t, ca, doc, awstest.SignOptions{EmbedCertificate: true}))},
		{name: "valid, document issued long ago", doc: oldDoc, sig: awstest.EncodeSignature(signDER(t, ca, oldDoc, awstest.SignOptions{}))},
		{name: "forged: signed by another key, its certificate enclosed", doc: doc, sig: awstest.EncodeSignature(signDER(t, other, doc, awstest.SignOptions{EmbedCertificate: true})), wantReason: identity.ReasonBadSignature},
		{name: "forged: signed by another key, no certificate", doc: doc, sig: awstest.EncodeSignature(signDER(t, other, doc, awstest.SignOptions{})), wantReason: identity.ReasonBadSignature},
		{name: "forged: impostor certificate with the region certificate's issuer and serial enclosed", doc: doc, sig: awstest.EncodeSignature(signDER(t, impostor, doc, awstest.SignOptions{EmbedCertificate: true})), wantReason: identity.ReasonBadSignature},
		{name: "signature for one region checked with another's certificate", trust: map[string]*x509.Certificate{"us-east-2": other.Certificate}, doc: doc, sig: awstest.EncodeSignature(der), wantReason: identity.ReasonBadSignature},
		{name: "altered signature value", doc: doc, sig: awstest.EncodeSignature(flipByte(der, len(der)-20)), wantReason: identity.ReasonBadSignature},
		{name: "altered document, signature untouched", doc: alteredDoc, sig: awstest.EncodeSignature(der), wantReason: identity.ReasonContentMismatch},
		{name: "altered content inside the signature only", doc: doc, sig: awstest.EncodeSignature(alteredBoth), wantReason: identity.ReasonContentMismatch},
		{name: "altered document and signed content alike", doc: alteredDoc, sig: awstest.EncodeSignature(alteredBoth), wantReason: identity.ReasonBadSignature},
		{name: "document is not the signed content", doc: otherDoc, sig: awstest.EncodeSignature(der), wantReason: identity.ReasonContentMismatch},
		{name: "document with trailing newline", doc: append(bytes.Clone(doc), '\n'), sig: awstest.EncodeSignature(der), wantReason: identity.ReasonContentMismatch},
		{name: "truncated document", doc: doc[:len(doc)-1], sig: awstest.EncodeSignature(der), wantReason: identity.ReasonContentMismatch},
		{name: "truncated signature DER", doc: doc, sig: awstest.EncodeSignature(der[:len(der)/2]), wantReason: identity.ReasonMalformed},
		{name: "truncated signature base64", doc: doc, sig: awstest.EncodeSignature(der)[:101], wantReason: identity.ReasonMalformed},
		{name: "detached signature", doc: doc, sig: awstest.EncodeSignature(signDER(t, ca, doc, awstest.SignOptions{Detached: true})), wantReason: identity.ReasonContentMismatch},
		{name: "SHA-1 digest", doc: doc, sig: awstest.EncodeSignature(sha1Signed), wantReason: identity.ReasonBadSignature},
		{name: "two signers", doc: doc, sig: awstest.EncodeSignature(twoSigners), wantReason: identity.ReasonMalformed},
		{name: "signature not base64", doc: doc, sig: []byte("not base64!"), wantReason: identity.ReasonMalformed},
		{name: "signature base64 of garbage", doc: doc, sig: awstest.EncodeSignature([]byte("garbage garbage")), wantReason: identity.ReasonMalformed},
		{name: "PEM of another type", doc: doc, sig: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), wantReason: identity.ReasonMalformed},
		{name: "empty signature", doc: doc, sig: nil, wantReason: identity.ReasonMalformed},
		{name: "empty document", doc: nil, sig: awstest.EncodeSignature(der), wantReason: identity.ReasonContentMismatch},
		{name: "signed malformed document", doc: badAccountDoc, sig: awstest.EncodeSignature(signDER(t, ca, badAccountDoc, awstest.SignOptions{})), wantReason: identity.ReasonMalformed},
		{name: "unknown region", doc: unknownRegionDoc, sig: awstest.EncodeSignature(signDER(t, ca, unknownRegionDoc, awstest.SignOptions{})), wantReason: identity.ReasonUnknownRegion},
		{name: "empty trust set", trust: map[string]*x509.Certificate{}, doc: doc, sig: awstest.EncodeSignature(der), wantReason: identity.ReasonUnknownRegion},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			trust := tt.trust
			if trust == nil {
				trust = map[string]*x509.Certificate{"us-east-2": ca.Certificate}
			}
			v, err := awsid.NewVerifier("onboarding.example.com", awsid.WithTrustedCertificates(trust))
			if err != nil {
				t.Fatal(err)
			}
			id, err := v.Verify(t.Context(), awsid.Credential{Document: tt.doc, Signature: tt.sig})
			if got := identity.ReasonOf(err); got != tt.wantReason {
				t.Fatalf("Verify() error = %v, want reason %q", err, tt.wantReason)
			}
			if tt.wantReason != "" {
				t.Logf("refused: %v", err)
				if id != nil {
					t.Errorf("Verify() returned an identity with an error")
				}
				if !errors.Is(err, tt.wantReason) {
					t.Errorf("errors.Is(err, %s) = false", tt.wantReason)
				}
				return
			}
			if id.AWS.InstanceID != "i-1234567890abcdef0" || id.AWS.Account != "123456789012" || id.AWS.Zone != "us-east-2b" {
				t.Errorf("identity %+v", id.AWS)
			}
		})
	}
}

// Every region of the embedded trust set resolves to the certificate that
// INDEX.tsv lists for it, and a document of that region is checked with it:
// signed by anyone else it fails as a bad signature, not as an unknown
// region.
func TestDefaultTrustSetUsedForEachRegion(t *testing.T) {
	index, err := certs.Index()
	if err != nil {
		t.Fatal(err)
	}
	v, err := awsid.NewVerifier("onboarding.example.com")
	if err != nil {
		t.Fatal(err)
	}
	if got := len(v.Regions()); got != len(index) {
		t.Fatalf("verifier trusts %d regions, INDEX.tsv lists %d", got, len(index))
	}
	ca := newCA(t, "any")
	for _, e := range index {
		t.Run(e.Region, func(t *testing.T) {
			cert, ok := v.Certificate(e.Region)
			if !ok {
				t.Fatalf("no certificate for %s", e.Region)
			}
			if got := certs.Fingerprint(cert); got != e.SHA256Fingerprint {
				t.Errorf("certificate %s, INDEX.tsv says %s", got, e.SHA256Fingerprint)
			}
			doc := awstest.Instance{Region: e.Region}.Document()
			sig, err := ca.Sign(doc)
			if err != nil {
				t.Fatal(err)
			}
			_, err = v.Verify(t.Context(), awsid.Credential{Document: doc, Signature: sig})
			if !errors.Is(err, identity.ReasonBadSignature) {
				t.Fatalf("Verify() = %v, want %s", err, identity.ReasonBadSignature)
			}
		})
	}
}

func TestTrustSetConfiguration(t *testing.T) {
	ca := newCA(t, "xx-test-1")
	doc := awstest.Instance{Region: "xx-test-1"}.Document()
	sig, err := ca.Sign(doc)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "xx-test-1.pem"), ca.CertificatePEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	fromDir, err := certs.LoadDirPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	usEast1Doc, usEast1Sig := readSample(t, "", "cloudinit-us-east-2")

	tests := []struct {
		name        string
		opts        []awsid.Option
		wantTestCA  identity.Reason
		wantGenuine identity.Reason
	}{
		{name: "default set", opts: nil, wantTestCA: identity.ReasonUnknownRegion},
		{name: "replaced from a directory", opts: []awsid.Option{awsid.WithTrustedCertificates(fromDir)}, wantGenuine: identity.ReasonUnknownRegion},
		{name: "extended from a directory", opts: []awsid.Option{awsid.WithAdditionalCertificates(fromDir)}},
		{name: "replaced then extended", opts: []awsid.Option{awsid.WithTrustedCertificates(map[string]*x509.Certificate{}), awsid.WithAdditionalCertificates(fromDir)}, wantGenuine: identity.ReasonUnknownRegion},
		{name: "region certificate overridden", opts: []awsid.Option{awsid.WithAdditionalCertificates(map[string]*x509.Certificate{"us-east-2": ca.Certificate})}, wantTestCA: identity.ReasonUnknownRegion, wantGenuine: identity.ReasonBadSignature},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := awsid.NewVerifier("onboarding.example.com", tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			_, err = v.Verify(t.Context(), awsid.Credential{Document: doc, Signature: sig})
			if got := identity.ReasonOf(err); got != tt.wantTestCA {
				t.Errorf("test CA document: %v, want reason %q", err, tt.wantTestCA)
			}
			_, err = v.Verify(t.Context(), awsid.Credential{Document: usEast1Doc, Signature: usEast1Sig})
			if got := identity.ReasonOf(err); got != tt.wantGenuine {
				t.Errorf("genuine us-east-2 document: %v, want reason %q", err, tt.wantGenuine)
			}
		})
	}
}

func TestNewVerifierErrors(t *testing.T) {
	tests := []struct {
		name     string
		audience string
		opts     []awsid.Option
	}{
		{name: "empty audience", audience: ""},
		{name: "STS endpoint not a URL", audience: "a", opts: []awsid.Option{awsid.WithSTSEndpoint("::")}},
		{name: "STS endpoint without host", audience: "a", opts: []awsid.Option{awsid.WithSTSEndpoint("https://")}},
		{name: "STS endpoint of another scheme", audience: "a", opts: []awsid.Option{awsid.WithSTSEndpoint("ftp://sts.example.com")}},
		{name: "negative window", audience: "a", opts: []awsid.Option{awsid.WithSTSFreshness(-time.Minute, time.Minute)}},
		{name: "nil certificate", audience: "a", opts: []awsid.Option{awsid.WithAdditionalCertificates(map[string]*x509.Certificate{"us-east-1": nil})}},
		{name: "bad region name", audience: "a", opts: []awsid.Option{awsid.WithTrustedCertificates(map[string]*x509.Certificate{"../x": {}})}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := awsid.NewVerifier(tt.audience, tt.opts...); err == nil {
				t.Fatal("NewVerifier() succeeded")
			}
		})
	}
}
