package token

import (
	"errors"
	"fmt"

	"github.com/embark-mesh/embark/onboarding/refusal"
)

// Reason names why a token was refused. Every Reason is also an error value,
// so callers test a refusal with errors.Is(err, token.ReasonExpired).
type Reason string

// The reasons Verify refuses a token. docs/onboarding-token.md says what they
// mean to an operator.
const (
	// ReasonMalformed: the token is not a compact JWS with a JSON header and
	// JSON claims, is too long, lacks a required claim (exp, iat, nbf, jti,
	// sub, embark.io/workload) or has one of the wrong shape.
	ReasonMalformed Reason = "Malformed"
	// ReasonDisallowedAlgorithm: the header's alg is not ES256, RS256 or
	// EdDSA (none and HMAC algorithms are always refused), or it is not the
	// algorithm of the key its kid names.
	ReasonDisallowedAlgorithm Reason = "DisallowedAlgorithm"
	// ReasonUnknownKey: the header's kid names neither the current nor the
	// previous signing key (or there is no kid, or no key is loaded).
	ReasonUnknownKey Reason = "UnknownKey"
	// ReasonBadSignature: the signature does not verify with the key the kid
	// names: the token was altered or forged.
	ReasonBadSignature Reason = "BadSignature"
	// ReasonWrongIssuer: iss is not this endpoint's issuer.
	ReasonWrongIssuer Reason = "WrongIssuer"
	// ReasonWrongAudience: aud is not exactly this onboarding plane's
	// audience.
	ReasonWrongAudience Reason = "WrongAudience"
	// ReasonExpired: exp is in the past, beyond the leeway.
	ReasonExpired Reason = "Expired"
	// ReasonNotYetValid: nbf or iat is in the future, beyond the leeway.
	ReasonNotYetValid Reason = "NotYetValid"
)

// Reasons lists every Reason, in the order of the constants above.
func Reasons() []Reason {
	return []Reason{
		ReasonMalformed, ReasonDisallowedAlgorithm, ReasonUnknownKey, ReasonBadSignature,
		ReasonWrongIssuer, ReasonWrongAudience, ReasonExpired, ReasonNotYetValid,
	}
}

// Error makes a Reason usable as a sentinel error.
func (r Reason) Error() string { return string(r) }

// Error is the error Verify returns for every refused token. Reason says what
// failed, Detail says it for an operator, Err is the underlying cause if there
// is one.
type Error struct {
	Reason Reason
	Detail string
	Err    error
}

var (
	_ error = Reason("")
	_ error = (*Error)(nil)
)

// Error formats the refusal as "onboarding token: <Reason>: <detail>: <cause>".
func (e *Error) Error() string {
	return "onboarding token: " + refusal.Message(e.Reason, e.Detail, e.Err)
}

// Unwrap exposes both the Reason (for errors.Is) and the cause.
func (e *Error) Unwrap() []error { return refusal.Unwrap(e.Reason, e.Err) }

// ReasonOf returns the Reason of the first *Error in err's chain, or "" if
// there is none.
func ReasonOf(err error) Reason {
	var te *Error
	if errors.As(err, &te) {
		return te.Reason
	}
	return ""
}

func refuse(reason Reason, format string, args ...any) *Error {
	return &Error{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

func refuseWrap(reason Reason, cause error, format string, args ...any) *Error {
	return &Error{Reason: reason, Detail: fmt.Sprintf(format, args...), Err: cause}
}
