package agent

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// failureReason names a platform failure PlatformCredential and an
// endpoint's refusal by its code, wrapped as register wraps it.
func TestFailureReason(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"platform credential", &platformError{err: errors.New("IMDS unreachable")}, "PlatformCredential"},
		{"no policy", fmt.Errorf("authorize: %w", status.Error(codes.PermissionDenied, "not authorized")), "PermissionDenied"},
		{"no WorkloadGroup", fmt.Errorf("register: %w", status.Error(codes.FailedPrecondition, "no group")), "FailedPrecondition"},
		{"endpoint down", fmt.Errorf("authorize: %w", status.Error(codes.Unavailable, "connection refused")), "Unavailable"},
		{"no status", errors.New("broken"), "Unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := failureReason(tc.err); got != tc.want {
				t.Errorf("failureReason(%v) = %s, want %s", tc.err, got, tc.want)
			}
		})
	}
}
