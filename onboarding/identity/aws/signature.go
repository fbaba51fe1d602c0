package aws

import (
	"bytes"
	"crypto"
	"crypto/rsa"
	"crypto/subtle"
	"crypto/x509"
	"encoding/asn1"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"slices"
	"time"

	"golang.org/x/crypto/cryptobyte"
	cbasn1 "golang.org/x/crypto/cryptobyte/asn1"

	"github.com/embark-mesh/embark/onboarding/identity"
)

// MaxSignatureSize bounds the signature a verifier accepts, in its base64
// or PEM form; real rsa2048 signatures are about 1.5 KiB.
const MaxSignatureSize = 16 << 10

// DecodeSignature turns the rsa2048 signature as IMDS returns it (base64,
// line breaks included) into DER. A PEM block of type PKCS7 is accepted as
// well. Errors carry ReasonMalformed.
func DecodeSignature(sig []byte) ([]byte, error) {
	if len(sig) == 0 {
		return nil, identity.Refuse(identity.ReasonMalformed, "rsa2048 signature is empty")
	}
	if len(sig) > MaxSignatureSize {
		return nil, identity.Refuse(identity.ReasonMalformed, "rsa2048 signature is %d bytes, more than %d", len(sig), MaxSignatureSize)
	}
	if trimmed := bytes.TrimSpace(sig); bytes.HasPrefix(trimmed, []byte("-----BEGIN")) {
		block, _ := pem.Decode(trimmed)
		if block == nil || block.Type != "PKCS7" {
			return nil, identity.Refuse(identity.ReasonMalformed, "rsa2048 signature is PEM but not a PKCS7 block")
		}
		return block.Bytes, nil
	}
	// The decoder skips line breaks itself; spaces and tabs are removed
	// first, from a copy.
	compact := sig
	if bytes.ContainsAny(sig, " \t") {
		compact = make([]byte, 0, len(sig))
		for _, c := range sig {
			switch c {
			case ' ', '\t', '\r', '\n':
			default:
				compact = append(compact, c)
			}
		}
	}
	der := make([]byte, base64.StdEncoding.DecodedLen(len(compact)))
	n, err := base64.StdEncoding.Decode(der, compact)
	if err != nil {
		return nil, identity.RefuseWrap(identity.ReasonMalformed, err, "rsa2048 signature is not base64")
	}
	return der[:n], nil
}

// parsePKCS7 parses a DER or BER PKCS#7 SignedData with exactly one signer.
// Certificates enclosed in it must parse, and are then discarded.
func parsePKCS7(der []byte) (*signedData, error) {
	sd, err := parseSignedData(der)
	var count errSignerCount
	switch {
	case errors.As(err, &count):
		return nil, identity.Refuse(identity.ReasonMalformed, "rsa2048 signature has %d signers, want exactly 1", int(count))
	case err != nil:
		return nil, identity.RefuseWrap(identity.ReasonMalformed, err, "rsa2048 signature is not a PKCS#7 SignedData")
	}
	if len(sd.certificates) > 0 {
		if _, err := x509.ParseCertificates(sd.certificates); err != nil {
			return nil, identity.RefuseWrap(identity.ReasonMalformed, err, "rsa2048 signature encloses a malformed certificate")
		}
	}
	return sd, nil
}

// strongDigests are the digest algorithms a signature may use, by their
// OID; AWS uses SHA-256.
var strongDigests = map[string]crypto.Hash{
	asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 1}.String(): crypto.SHA256,
	asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 2}.String(): crypto.SHA384,
	asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 3}.String(): crypto.SHA512,
}

// rsaSignatureAlgorithms are the digestEncryptionAlgorithm OIDs of an RSA
// PKCS#1 v1.5 signature: rsaEncryption and sha{1,256,384,512}WithRSA. The
// digest is the signer's digestAlgorithm whichever of them is named.
var rsaSignatureAlgorithms = []asn1.ObjectIdentifier{
	{1, 2, 840, 113549, 1, 1, 1}, {1, 2, 840, 113549, 1, 1, 5},
	{1, 2, 840, 113549, 1, 1, 11}, {1, 2, 840, 113549, 1, 1, 12}, {1, 2, 840, 113549, 1, 1, 13},
}

// checkContent requires the content signed by sd to be document, byte for
// byte.
func checkContent(sd *signedData, document []byte) error {
	if len(sd.content) == 0 {
		return identity.Refuse(identity.ReasonContentMismatch, "rsa2048 signature carries no signed content (detached); the signed document must be enclosed")
	}
	if !bytes.Equal(sd.content, document) {
		return identity.Refuse(identity.ReasonContentMismatch, "the submitted document (%d bytes) is not the content signed by the rsa2048 signature (%d bytes)", len(document), len(sd.content))
	}
	return nil
}

// trustedKey is a region's AWS certificate and its RSA public key, taken
// from the certificate once when the verifier is made.
type trustedKey struct {
	cert *x509.Certificate
	pub  *rsa.PublicKey // nil when the certificate's key is not RSA: no signature verifies
}

func newTrustedKey(cert *x509.Certificate) trustedKey {
	pub, _ := cert.PublicKey.(*rsa.PublicKey)
	return trustedKey{cert: cert, pub: pub}
}

// verifySigner verifies sd's only signature with key and nothing else.
// Certificates enclosed in the PKCS#7 envelope are not used: the signer
// must be key's certificate (issuer and serial number), the signed
// attributes' message digest must be the content's, their signing time (if
// any) within the certificate's validity, and the signature must verify
// with the certificate's key.
func verifySigner(sd *signedData, key trustedKey, region string) error {
	si := &sd.signer
	hash, ok := strongDigests[si.digestAlg.String()]
	if !ok {
		return identity.Refuse(identity.ReasonBadSignature, "the rsa2048 signature uses digest algorithm %s; only SHA-256, SHA-384 and SHA-512 are accepted", si.digestAlg)
	}
	if si.serial.Cmp(key.cert.SerialNumber) != 0 || !bytes.Equal(si.issuer, key.cert.RawIssuer) {
		return identity.Refuse(identity.ReasonBadSignature, "the rsa2048 signature was not made by the AWS certificate of region %s", region)
	}
	digest := digestOf(hash, 0, sd.content)
	if si.attributes != nil {
		if err := checkAttributes(si, digest, key.cert, region); err != nil {
			return err
		}
		// The signature covers the attributes as a DER SET OF.
		digest = digestOf(hash, 0x31, si.attributes[1:])
	}
	if !slices.ContainsFunc(rsaSignatureAlgorithms, si.encryptionAlg.Equal) || key.pub == nil {
		return identity.Refuse(identity.ReasonBadSignature, "the rsa2048 signature (algorithm %s) does not verify with the AWS certificate of region %s", si.encryptionAlg, region)
	}
	if err := rsa.VerifyPKCS1v15(key.pub, hash, digest, si.signature); err != nil {
		return identity.RefuseWrap(identity.ReasonBadSignature, err, "the rsa2048 signature does not verify with the AWS certificate of region %s", region)
	}
	return nil
}

// digestOf returns the hash of data, preceded by the octet first unless it
// is 0.
func digestOf(hash crypto.Hash, first byte, data []byte) []byte {
	h := hash.New()
	if first != 0 {
		h.Write([]byte{first})
	}
	h.Write(data)
	return h.Sum(nil)
}

// checkAttributes checks si's authenticated attributes against the
// content's digest and cert: they must be in the order they are signed in,
// hold the content's message digest, and a signing time, if they hold one
// that parses, within cert's validity.
func checkAttributes(si *signerInfo, digest []byte, cert *x509.Certificate, region string) error {
	if !si.attributesSorted {
		return identity.Refuse(identity.ReasonBadSignature, "the rsa2048 signature's authenticated attributes are not in DER order, so they are not what was signed")
	}
	values := cryptobyte.String(si.messageDigest)
	var signed cryptobyte.String
	if si.messageDigest == nil || !values.ReadASN1(&signed, cbasn1.OCTET_STRING) {
		return identity.Refuse(identity.ReasonBadSignature, "the rsa2048 signature carries no message digest attribute for region %s", region)
	}
	if subtle.ConstantTimeCompare(signed, digest) != 1 {
		return identity.Refuse(identity.ReasonBadSignature, "the digest signed for region %s does not match the enclosed document", region)
	}
	if si.signingTime == nil {
		return nil
	}
	var at time.Time
	if _, err := asn1.Unmarshal(si.signingTime, &at); err != nil {
		return nil
	}
	if at.After(cert.NotAfter) || at.Before(cert.NotBefore) {
		return identity.Refuse(identity.ReasonBadSignature, "the rsa2048 signature's signing time %s is outside the validity of the AWS certificate of region %s", at.Format(time.RFC3339), region)
	}
	return nil
}
