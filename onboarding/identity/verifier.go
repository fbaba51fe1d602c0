package identity

import "context"

// Verifier turns one kind of platform credential into a verified identity.
//
// Verify returns a non-nil *Identity and a nil error only when the credential
// was proven against the verifier's configured trust anchors. Every refusal
// is an error for which [ReasonOf] reports a [Reason]; errors.Is(err, reason)
// holds for it as well.
type Verifier[C any] interface {
	Verify(ctx context.Context, credential C) (*Identity, error)
}
