package aws

import (
	"bytes"
	"crypto/x509"
	"encoding/asn1"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"slices"

	"github.com/smallstep/pkcs7"

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
	compact := make([]byte, 0, len(sig))
	for _, c := range sig {
		switch c {
		case ' ', '\t', '\r', '\n':
		default:
			compact = append(compact, c)
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
func parsePKCS7(der []byte) (p7 *pkcs7.PKCS7, err error) {
	// The PKCS#7 parser is third-party code fed with outside input: a panic
	// in it must refuse the credential, not crash the endpoint.
	defer func() {
		if r := recover(); r != nil {
			p7, err = nil, identity.Refuse(identity.ReasonMalformed, "rsa2048 signature is not a PKCS#7 SignedData (parser panic: %v)", r)
		}
	}()
	p7, err = pkcs7.Parse(der)
	if err != nil {
		return nil, identity.RefuseWrap(identity.ReasonMalformed, err, "rsa2048 signature is not a PKCS#7 SignedData")
	}
	if len(p7.Signers) != 1 {
		return nil, identity.Refuse(identity.ReasonMalformed, "rsa2048 signature has %d signers, want exactly 1", len(p7.Signers))
	}
	return p7, nil
}

// strongDigests are the digest algorithms a signature may use; AWS uses
// SHA-256.
var strongDigests = []asn1.ObjectIdentifier{
	pkcs7.OIDDigestAlgorithmSHA256, pkcs7.OIDDigestAlgorithmSHA384, pkcs7.OIDDigestAlgorithmSHA512,
}

// checkContent requires the content signed by p7 to be document, byte for
// byte.
func checkContent(p7 *pkcs7.PKCS7, document []byte) error {
	if len(p7.Content) == 0 {
		return identity.Refuse(identity.ReasonContentMismatch, "rsa2048 signature carries no signed content (detached); the signed document must be enclosed")
	}
	if !bytes.Equal(p7.Content, document) {
		return identity.Refuse(identity.ReasonContentMismatch, "the submitted document (%d bytes) is not the content signed by the rsa2048 signature (%d bytes)", len(document), len(p7.Content))
	}
	return nil
}

// verifySigner verifies p7's only signature with cert and nothing else.
// Certificates enclosed in the PKCS#7 envelope are discarded: the signer
// must be cert (issuer and serial number) and the signature must verify
// with cert's key.
func verifySigner(p7 *pkcs7.PKCS7, cert *x509.Certificate, region string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = identity.Refuse(identity.ReasonBadSignature, "rsa2048 signature cannot be verified (verifier panic: %v)", r)
		}
	}()
	digest := p7.Signers[0].DigestAlgorithm.Algorithm
	if !slices.ContainsFunc(strongDigests, digest.Equal) {
		return identity.Refuse(identity.ReasonBadSignature, "the rsa2048 signature uses digest algorithm %s; only SHA-256, SHA-384 and SHA-512 are accepted", digest)
	}
	p7.Certificates = []*x509.Certificate{cert}
	if err := p7.Verify(); err != nil {
		var mismatch *pkcs7.MessageDigestMismatchError
		switch {
		case errors.As(err, &mismatch):
			return identity.RefuseWrap(identity.ReasonBadSignature, err, "the digest signed for region %s does not match the enclosed document", region)
		case p7.GetOnlySigner() == nil:
			return identity.RefuseWrap(identity.ReasonBadSignature, err, "the rsa2048 signature was not made by the AWS certificate of region %s", region)
		default:
			return identity.RefuseWrap(identity.ReasonBadSignature, err, "the rsa2048 signature does not verify with the AWS certificate of region %s", region)
		}
	}
	return nil
}
