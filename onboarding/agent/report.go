package agent

import (
	"errors"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/status"

	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
)

// maxReportedMessageBytes is the most of an error's message the agent
// reports on Register; the endpoint refuses a longer one.
const maxReportedMessageBytes = 256

// reportedReason is the form the endpoint accepts for a reported reason.
var reportedReason = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]{0,63}$`)

// failureMessage is what the agent reports of a failed onboarding attempt:
// the endpoint's status message for a refusal, else the error's text.
func failureMessage(err error) string {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus().Message()
	}
	return err.Error()
}

// lastErrorReport is the last failed onboarding attempt in the form the
// endpoint accepts (RegisterRequest.last_error): a word as the reason,
// control characters replaced by spaces, at most 256 bytes of UTF-8. It is
// nil when there was none.
func lastErrorReport(reason, message string) *onboardingv1alpha1.AgentError {
	if reason == "" {
		return nil
	}
	if !reportedReason.MatchString(reason) {
		reason = "Unknown"
	}
	message = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(message, "?"))
	for len(message) > maxReportedMessageBytes {
		_, n := utf8.DecodeLastRuneInString(message)
		message = message[:len(message)-n]
	}
	return &onboardingv1alpha1.AgentError{Reason: reason, Message: message}
}
