package relay

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errorCode labels an upstream failure with its gRPC code: wrapped
// statuses keep theirs, istiod ending a stream cleanly is OK.
func TestErrorCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"istiod ended the stream", io.EOF, codes.OK},
		{"a status", status.Error(codes.Unavailable, "connection refused"), codes.Unavailable},
		{"a wrapped status", fmt.Errorf("open stream: %w", status.Error(codes.PermissionDenied, "no")), codes.PermissionDenied},
		{"no status", errors.New("broken"), codes.Unknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := errorCode(tc.err); got != tc.want {
				t.Errorf("errorCode(%v) = %s, want %s", tc.err, got, tc.want)
			}
		})
	}
}

// The istiod_revision label of an unnamed revision is "default".
func TestRevisionLabel(t *testing.T) {
	for _, tc := range []struct{ revision, want string }{{"", "default"}, {"default", "default"}, {"canary", "canary"}} {
		if got := revisionLabel(tc.revision); got != tc.want {
			t.Errorf("revisionLabel(%q) = %q, want %q", tc.revision, got, tc.want)
		}
	}
}

// Pushes of the types istiod sends are counted by type, anything else as
// other.
func TestTypeLabel(t *testing.T) {
	for _, tc := range []struct{ typeURL, want string }{
		{"type.googleapis.com/envoy.config.cluster.v3.Cluster", "envoy.config.cluster.v3.Cluster"},
		{"type.googleapis.com/istio.networking.nds.v1.NameTable", "istio.networking.nds.v1.NameTable"},
		{"type.googleapis.com/invented.by.a.sidecar.v1", "other"},
		{"envoy.config.cluster.v3.Cluster", "envoy.config.cluster.v3.Cluster"},
		{"", "other"},
	} {
		if got := typeLabel(tc.typeURL); got != tc.want {
			t.Errorf("typeLabel(%q) = %q, want %q", tc.typeURL, got, tc.want)
		}
	}
}
