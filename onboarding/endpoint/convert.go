package endpoint

import (
	"net/http"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	awsidentity "github.com/embark-mesh/embark/onboarding/identity/aws"
)

// AWSCredentialToProto is the wire form of an AWS platform credential, as an
// agent sends it in AuthorizeRequest; awsCredentialFromProto is its inverse.
func AWSCredentialToProto(cred *awsidentity.Credential) *onboardingv1alpha1.AWSCredential {
	out := &onboardingv1alpha1.AWSCredential{InstanceIdentityDocument: cred.Document, Rsa2048Signature: string(cred.Signature)}
	if cred.STS != nil {
		r := &onboardingv1alpha1.SignedHTTPRequest{Method: cred.STS.Method, Url: cred.STS.URL, Body: cred.STS.Body}
		for name, vals := range cred.STS.Headers {
			for _, v := range vals {
				r.Headers = append(r.Headers, &onboardingv1alpha1.Header{Name: name, Value: v})
			}
		}
		out.StsGetCallerIdentity = r
	}
	return out
}

func awsCredentialFromProto(c *onboardingv1alpha1.AWSCredential) awsidentity.Credential {
	cred := awsidentity.Credential{Document: c.GetInstanceIdentityDocument(), Signature: []byte(c.GetRsa2048Signature())}
	if r := c.GetStsGetCallerIdentity(); r != nil {
		h := http.Header{}
		for _, kv := range r.GetHeaders() {
			h.Add(kv.GetName(), kv.GetValue())
		}
		cred.STS = &awsidentity.STSRequest{Method: r.GetMethod(), URL: r.GetUrl(), Headers: h, Body: r.GetBody()}
	}
	return cred
}
