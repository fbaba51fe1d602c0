// Package awswire is the AWS EC2 credential as it travels from an agent to
// the onboarding endpoint: the instance identity document, its rsa2048
// signature and an optional signed sts:GetCallerIdentity request
// ([Credential]), the document's fields and their shape checks
// ([ParseDocument]), and the conversion to and from the AuthorizeRequest
// proto ([ToProto], [FromProto]).
//
// Both sides use it: the agent (package client and the agent's AWS
// platform) builds a Credential, the verifier (package aws) checks one. It
// holds no verification code on purpose: an agent that imports it links
// neither PKCS#7 nor the embedded AWS certificates. Nothing here makes a
// credential trustworthy; a parsed [Document] is only well-formed.
package awswire

import (
	"net/http"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
)

// AudienceHeader is the HTTP header that binds a signed
// sts:GetCallerIdentity request to one onboarding plane. The agent sets it
// to the endpoint's audience before signing, so it is part of SigV4's
// SignedHeaders; a request signed for another audience, or with the header
// added after signing, is refused by the verifier.
const AudienceHeader = "X-Embark-Onboarding-Audience"

// Credential is what an EC2 instance presents.
type Credential struct {
	// Document is the instance identity document exactly as IMDS serves it
	// at /latest/dynamic/instance-identity/document.
	Document []byte `json:"document"`
	// Signature is the RSA-2048 PKCS#7 signature exactly as IMDS serves it
	// at /latest/dynamic/instance-identity/rsa2048 (base64).
	Signature []byte `json:"signature"`
	// STS is an optional signed sts:GetCallerIdentity request made with the
	// instance's role credentials; it proves the IAM role. Policies that name
	// ec2.iamRoleNames require it.
	STS *STSRequest `json:"sts,omitempty"`
}

// STSRequest is a signed sts:GetCallerIdentity HTTP request produced by the
// agent with the instance's role credentials. The verifier does not send it
// where URL says: it checks that URL names the STS endpoint the verifier is
// configured with for the document's region and sends it there.
type STSRequest struct {
	Method  string      `json:"method"`
	URL     string      `json:"url"`
	Headers http.Header `json:"headers"`
	Body    []byte      `json:"body"`
}

// ToProto is the wire form of cred, as an agent sends it in
// AuthorizeRequest.
func ToProto(cred *Credential) *onboardingv1alpha1.AWSCredential {
	out := &onboardingv1alpha1.AWSCredential{InstanceIdentityDocument: cred.Document, Rsa2048Signature: string(cred.Signature)}
	if cred.STS != nil {
		out.StsGetCallerIdentity = signedToProto(cred.STS)
	}
	return out
}

// FromProto is the inverse of [ToProto]: the credential an
// AuthorizeRequest carries, unverified. A nil c gives an empty credential.
func FromProto(c *onboardingv1alpha1.AWSCredential) Credential {
	cred := Credential{Document: c.GetInstanceIdentityDocument(), Signature: []byte(c.GetRsa2048Signature())}
	if r := c.GetStsGetCallerIdentity(); r != nil {
		cred.STS = signedFromProto(r)
	}
	return cred
}
