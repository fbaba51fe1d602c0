package aws

import (
	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/aws/awswire"
)

// MaxDocumentSize bounds the instance identity document a verifier accepts.
const MaxDocumentSize = awswire.MaxDocumentSize

// Document is the wire type [awswire.Document]: the part of an EC2 instance
// identity document that Embark uses. Only a document whose signature
// verified may be believed.
type Document = awswire.Document

// ParseDocument is [awswire.ParseDocument] with its refusal as an
// *identity.VerificationError with ReasonMalformed. It does not verify
// anything: see [Verifier.Verify].
func ParseDocument(data []byte) (*Document, error) {
	doc, err := awswire.ParseDocument(data)
	if err != nil {
		return nil, identity.RefuseWrap(identity.ReasonMalformed, err, "instance identity document")
	}
	return doc, nil
}
