package awswire_test

import (
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
)

// FuzzFromProto: an AWSCredential of any content, as a client sends it,
// converts without panicking, and converting back and again gives the same
// credential.
func FuzzFromProto(f *testing.F) {
	for _, c := range []*onboardingv1alpha1.AWSCredential{
		{},
		{InstanceIdentityDocument: []byte(`{"accountId":"123456789012"}`), Rsa2048Signature: "c2ln"},
		{StsGetCallerIdentity: &onboardingv1alpha1.SignedHTTPRequest{
			Method: "POST", Url: "https://sts.us-east-2.amazonaws.com/", Body: []byte("Action=GetCallerIdentity&Version=2011-06-15"),
			Headers: []*onboardingv1alpha1.Header{{Name: "X-Amz-Date", Value: "20260101T000000Z"}, {Name: "x-amz-date", Value: "again"}},
		}},
	} {
		data, err := proto.Marshal(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var msg onboardingv1alpha1.AWSCredential
		if proto.Unmarshal(data, &msg) != nil {
			return
		}
		cred := awswire.FromProto(&msg)
		again := awswire.FromProto(awswire.ToProto(&cred))
		if !reflect.DeepEqual(normalize(cred), normalize(again)) {
			t.Fatalf("FromProto(ToProto(cred)) = %+v, want %+v", again, cred)
		}
	})
}

// normalize makes empty and nil byte slices alike: the proto does not tell
// them apart.
func normalize(c awswire.Credential) awswire.Credential {
	if len(c.Document) == 0 {
		c.Document = nil
	}
	if len(c.Signature) == 0 {
		c.Signature = nil
	}
	if c.STS != nil {
		s := *c.STS
		if len(s.Body) == 0 {
			s.Body = nil
		}
		c.STS = &s
	}
	return c
}
