package aws

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"

	"github.com/smallstep/pkcs7"
)

// smallstepContent parses der with smallstep/pkcs7, the parser the
// verifier used before its own, and returns the enclosed content and the
// number of signers.
func smallstepContent(der []byte) (content []byte, signers int, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	p7, err := pkcs7.Parse(der)
	if err != nil {
		return nil, 0, false
	}
	return p7.Content, len(p7.Signers), true
}

// FuzzParseSignedData: the PKCS#7 parser never panics, and what it accepts
// smallstep/pkcs7 parses too, to the same content and one signer, whose
// fields have the shape the verifier relies on.
func FuzzParseSignedData(f *testing.F) {
	for _, name := range []string{"cloudinit-us-east-2", "metaphor-ap-southeast-2", "teleport-us-west-2", "negative/vssm-us-east-1-BADSIG-negative"} {
		b64, err := os.ReadFile(filepath.Join("testdata", name+".rsa2048.b64"))
		if err != nil {
			f.Fatal(err)
		}
		der, err := DecodeSignature(b64)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(der)
	}
	seed, err := base64.StdEncoding.DecodeString("MIAGCSqGSIb3DQEHAqCAMIACAQExDzANBglghkgBZQMEAgEFADCA")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Fuzz(func(t *testing.T, der []byte) {
		sd, err := parseSignedData(der)
		if err != nil {
			return
		}
		si := sd.signer
		if si.serial == nil || len(si.issuer) == 0 || si.issuer[0] != tagSequence {
			t.Fatalf("accepted signer without an issuer and serial: %+v", si)
		}
		if si.attributes != nil && si.attributes[0] != tagContext0 {
			t.Fatalf("accepted authenticated attributes with tag 0x%02x", si.attributes[0])
		}
		if (si.messageDigest != nil || si.signingTime != nil) && si.attributes == nil {
			t.Fatal("attribute values without authenticated attributes")
		}
		content, signers, ok := smallstepContent(der)
		if !ok || signers != 1 {
			t.Fatalf("accepted what smallstep/pkcs7 refuses (ok %v, %d signers)", ok, signers)
		}
		if !bytes.Equal(content, sd.content) {
			t.Fatalf("content %q, smallstep/pkcs7 reads %q", sd.content, content)
		}
	})
}
