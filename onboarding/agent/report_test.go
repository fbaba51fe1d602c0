package agent

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The last error goes on Register in the form the endpoint accepts,
// whatever the endpoint or the platform said.
func TestLastErrorReport(t *testing.T) {
	long := strings.Repeat("é", 200) // 400 bytes
	for _, tc := range []struct {
		name            string
		reason, message string
		wantReason      string
		wantMessage     string
	}{
		{name: "gRPC refusal", reason: "PermissionDenied", message: "not authorized to onboard (request id 0123456789abcdef)",
			wantReason: "PermissionDenied", wantMessage: "not authorized to onboard (request id 0123456789abcdef)"},
		{name: "unknown code", reason: "Code(99)", message: "x", wantReason: "Unknown", wantMessage: "x"},
		{name: "control characters", reason: "PlatformCredential", message: "IMDS:\n\x1b[2Jrefused\u202e",
			wantReason: "PlatformCredential", wantMessage: "IMDS:  [2Jrefused "},
		{name: "not UTF-8", reason: "BootstrapWrite", message: "open \xff: denied", wantReason: "BootstrapWrite", wantMessage: "open ?: denied"},
		{name: "long", reason: "Unavailable", message: long, wantReason: "Unavailable", wantMessage: strings.Repeat("é", 128)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := lastErrorReport(tc.reason, tc.message)
			if got.GetReason() != tc.wantReason || got.GetMessage() != tc.wantMessage {
				t.Errorf("report = %q %q, want %q %q", got.GetReason(), got.GetMessage(), tc.wantReason, tc.wantMessage)
			}
			if len(got.GetMessage()) > maxReportedMessageBytes || !utf8.ValidString(got.GetMessage()) {
				t.Errorf("message of %d bytes or not UTF-8", len(got.GetMessage()))
			}
		})
	}
	if got := lastErrorReport("", "stale message"); got != nil {
		t.Errorf("no failure reported %v, want none", got)
	}
}

func TestFailureMessage(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("authorize: %w", status.Error(codes.PermissionDenied, "not authorized to onboard")), "not authorized to onboard"},
		{status.Error(codes.Unavailable, "connection refused"), "connection refused"},
		{&platformError{err: errors.New("IMDS unreachable")}, "platform credential: IMDS unreachable"},
	} {
		if got := failureMessage(tc.err); got != tc.want {
			t.Errorf("failureMessage(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
