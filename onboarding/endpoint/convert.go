package endpoint

import (
	"net/http"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	awsidentity "github.com/embark-mesh/embark/onboarding/identity/aws"
	awsclient "github.com/embark-mesh/embark/onboarding/identity/aws/client"
)

// AWSCredentialToProto is the wire form of an AWS platform credential, as an
// agent sends it in AuthorizeRequest; awsCredentialFromProto is its inverse.
func AWSCredentialToProto(cred *awsidentity.Credential) *onboardingv1alpha1.AWSCredential {
	return awsclient.ToProto(cred)
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
