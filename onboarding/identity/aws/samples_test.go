package aws_test

import (
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity"
	awsid "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/aws/certs"
)

type sample struct {
	name        string
	dir         string
	region      string
	account     string
	instance    string
	zone        string
	partition   string
	pendingTime string
}

// The genuine AWS-signed documents of testdata/. They were issued long
// before the test runs, which must not matter: a document's age is not a
// reason to refuse it.
var genuineSamples = []sample{
	{name: "metaphor-ap-southeast-2", region: "ap-southeast-2", account: "189292791360", instance: "i-0c5541936caf78c12", zone: "ap-southeast-2a", partition: "aws", pendingTime: "2026-02-16T00:38:27Z"},
	{name: "cloudinit-us-east-2", region: "us-east-2", account: "437526006925", instance: "i-075f088c72ad3271c", zone: "us-east-2b", partition: "aws", pendingTime: "2018-10-05T20:10:43Z"},
	{name: "teleport-us-west-2", region: "us-west-2", account: "278576220453", instance: "i-078517ca8a70a1dde", zone: "us-west-2a", partition: "aws", pendingTime: "2021-09-03T21:25:44Z"},
}

func readSample(t *testing.T, dir, name string) (doc, sig []byte) {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("testdata", dir, name+".document.json"))
	if err != nil {
		t.Fatal(err)
	}
	sig, err = os.ReadFile(filepath.Join("testdata", dir, name+".rsa2048.b64"))
	if err != nil {
		t.Fatal(err)
	}
	return doc, sig
}

func TestGenuineSamplesVerify(t *testing.T) {
	v, err := awsid.NewVerifier("onboarding.example.com")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range genuineSamples {
		t.Run(s.name, func(t *testing.T) {
			doc, sig := readSample(t, s.dir, s.name)
			id, err := v.Verify(t.Context(), awsid.Credential{Document: doc, Signature: sig})
			if err != nil {
				t.Fatalf("Verify() = %v", err)
			}
			a := id.AWS
			if a.Region != s.region || a.Account != s.account || a.InstanceID != s.instance || a.Partition != s.partition {
				t.Errorf("identity %+v, want region %s account %s instance %s partition %s", a, s.region, s.account, s.instance, s.partition)
			}
			if a.Zone != s.zone {
				t.Errorf("zone %s, want %s", a.Zone, s.zone)
			}
			if !strings.HasPrefix(a.Zone, a.Region) {
				t.Errorf("zone %s not in region %s", a.Zone, a.Region)
			}
			if id.Method != identity.MethodAWSInstanceIdentityDocument || a.STSProven || a.IAMRole != "" {
				t.Errorf("method %s, STS proven %v, role %q: want document only", id.Method, a.STSProven, a.IAMRole)
			}
			if got := a.PendingTime.Format(time.RFC3339); got != s.pendingTime {
				t.Errorf("pendingTime %s, want %s", got, s.pendingTime)
			}
		})
	}
}

func TestNegativeSampleFails(t *testing.T) {
	v, err := awsid.NewVerifier("onboarding.example.com")
	if err != nil {
		t.Fatal(err)
	}
	doc, sig := readSample(t, "negative", "vssm-us-east-1-BADSIG-negative")
	_, err = v.Verify(t.Context(), awsid.Credential{Document: doc, Signature: sig})
	if !errors.Is(err, identity.ReasonBadSignature) {
		t.Fatalf("Verify() = %v, want %s", err, identity.ReasonBadSignature)
	}
}

// A genuine document presented with the certificate of any other region
// (put in place of its own) fails.
func TestGenuineSamplesFailWithOtherRegionsCertificates(t *testing.T) {
	all, err := certs.Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range genuineSamples {
		doc, sig := readSample(t, s.dir, s.name)
		for region, cert := range all {
			if region == s.region {
				continue
			}
			t.Run(s.name+"/with-"+region, func(t *testing.T) {
				v, err := awsid.NewVerifier("a", awsid.WithTrustedCertificates(map[string]*x509.Certificate{s.region: cert}))
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
}
