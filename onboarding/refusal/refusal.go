// Package refusal is the one shape of the onboarding plane's refusal
// errors (identity.VerificationError for platform credentials, token.Error
// for onboarding tokens): a reason that is itself a sentinel error, so that
// callers test a refusal with errors.Is(err, reason); a detail for an
// operator; and the underlying cause, if any, still reachable with
// errors.Is and errors.As.
package refusal

// Message formats a refusal as "<reason>: <detail>: <cause>", leaving out
// an empty detail and a nil cause.
func Message(reason error, detail string, cause error) string {
	msg := reason.Error()
	if detail != "" {
		msg += ": " + detail
	}
	if cause != nil {
		msg += ": " + cause.Error()
	}
	return msg
}

// Unwrap is what a refusal unwraps to: its reason (for errors.Is) and its
// cause, if any.
func Unwrap(reason, cause error) []error {
	if cause == nil {
		return []error{reason}
	}
	return []error{reason, cause}
}
