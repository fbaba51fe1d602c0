package agent

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A refusal is logged with its gRPC code, whether the error is the status
// itself or wraps it; anything else is logged as a failure.
func TestLogRefusalNamesTheCode(t *testing.T) {
	unavailable := status.Error(codes.Unavailable, "connection refused")
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"a status error", unavailable, `code=Unavailable message="connection refused"`},
		{"a wrapped status error", fmt.Errorf("renew: %w", status.Error(codes.NotFound, "gone")), "code=NotFound message=gone"},
		{"not a status", errors.New("disk full"), `failed; retrying" error="disk full"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			a := &Agent{log: slog.New(slog.NewTextHandler(&buf, nil))}
			a.logRefusal("sidecar token renewal", tc.err)
			if !strings.Contains(buf.String(), tc.want) {
				t.Errorf("logged %q, want %q", buf.String(), tc.want)
			}
		})
	}
}
