package aws_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/embark-mesh/embark/onboarding/identity"
	awsid "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
)

func readTestdata(f *testing.F, name string) []byte {
	f.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// FuzzParseDocument: the document parser never panics, and either refuses
// with ReasonMalformed or returns the fields names are made of, valid.
func FuzzParseDocument(f *testing.F) {
	f.Add(readTestdata(f, "cloudinit-us-east-2.document.json"))
	f.Add(readTestdata(f, "metaphor-ap-southeast-2.document.json"))
	f.Add(awstest.Instance{Zone: "us-east-2-lax-1a"}.Document())
	f.Add([]byte(`{"accountId":"123456789012","instanceId":"i-01234567","region":"us-east-1","availabilityZone":"us-east-1a"}`))
	f.Add([]byte(`{"accountId":1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := awsid.ParseDocument(data)
		if err != nil {
			if identity.ReasonOf(err) != identity.ReasonMalformed {
				t.Fatalf("refusal without ReasonMalformed: %v", err)
			}
			return
		}
		id := &identity.Identity{AWS: &identity.AWSIdentity{
			Partition: doc.Partition(), Account: doc.AccountID, Zone: doc.AvailabilityZone, InstanceID: doc.InstanceID,
		}}
		name := "aws-" + id.AWS.Partition + "-" + id.AWS.Account + "-" + id.AWS.Zone + "-ec2-" + id.AWS.InstanceID
		if sanitized := identity.SanitizeDNSLabel(name); sanitized != name {
			t.Fatalf("accepted document yields name %q, sanitized %q: a field has characters a name cannot hold", name, sanitized)
		}
	})
}

// FuzzVerifyDocument drives the PKCS#7 path (base64/PEM decoding, BER/DER
// parsing, content comparison, signature verification) with arbitrary
// documents and signatures. It never panics and every refusal has a
// reason.
func FuzzVerifyDocument(f *testing.F) {
	for _, name := range []string{"cloudinit-us-east-2", "teleport-us-west-2", "negative/vssm-us-east-1-BADSIG-negative"} {
		f.Add(readTestdata(f, name+".document.json"), readTestdata(f, name+".rsa2048.b64"))
	}
	f.Add([]byte("{}"), []byte("MIAGCSqGSIb3DQEHAqCAMIACAQExDzANBglghkgBZQMEAgEFADCA"))
	f.Add([]byte("{}"), []byte("-----BEGIN PKCS7-----\nMAA=\n-----END PKCS7-----\n"))
	v, err := awsid.NewVerifier("fuzz.example.com")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, document, signature []byte) {
		id, err := v.Verify(t.Context(), awsid.Credential{Document: document, Signature: signature})
		if err != nil {
			if identity.ReasonOf(err) == "" {
				t.Fatalf("refusal without reason: %v", err)
			}
			if id != nil {
				t.Fatal("identity returned with an error")
			}
			return
		}
		if id.AWS == nil || id.AWS.Account == "" || id.AWS.InstanceID == "" {
			t.Fatalf("accepted credential yields identity %+v", id.AWS)
		}
	})
}
