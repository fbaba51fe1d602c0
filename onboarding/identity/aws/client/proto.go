package client

import (
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	awsid "github.com/embark-mesh/embark/onboarding/identity/aws"
)

// ToProto is the wire form of an AWS platform credential, as an agent sends
// it in AuthorizeRequest (endpoint.AWSCredentialToProto is this function;
// it lives here so that agents need not link the endpoint).
func ToProto(cred *awsid.Credential) *onboardingv1alpha1.AWSCredential {
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
