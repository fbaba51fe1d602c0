package endpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// GenericDenialFormat is the one answer an agent gets for a policy denial or
// a WorkloadGroup that does not exist, unless its source is one of
// Options.DetailedDenialSources: the same code (PERMISSION_DENIED) and the
// same shape whatever the reason, so that neither the policies (accounts,
// roles, zones, subjects) nor the existence of a WorkloadGroup can be read
// from it. The request ID is the one the endpoint's log line of the denial
// carries, beside the explanation.
const GenericDenialFormat = "not authorized to onboard (request id %s)"

// denial is one refusal whose explanation is for operators only.
type denial struct {
	// stage is where it happened (authorize, register, renew).
	stage string
	// reason is the metrics label (PolicyDenied, WorkloadGroupNotFound).
	reason string
	// detail is the explanation: the policy's closest rules, or the
	// missing WorkloadGroup.
	detail string
	// code is what a detailed answer carries.
	code codes.Code
}

// deny logs and counts d with a fresh request ID and answers the agent:
// with the explanation when the connection's source may see it, else with
// GenericDenialFormat. The Event on the WorkloadGroup, when there is one,
// is the Authorizer's.
func (s *Server) deny(ctx context.Context, d denial) error {
	id := newRequestID()
	s.opts.Metrics.denied(d.stage, d.reason)
	s.log.Info("onboarding denied", "stage", d.stage, "reason", d.reason, "requestID", id, "detail", d.detail)
	if s.detailedFor(ctx) {
		return status.Errorf(d.code, "%s (request id %s)", d.detail, id)
	}
	return status.Errorf(codes.PermissionDenied, GenericDenialFormat, id)
}

// detailedFor reports whether the connection's source address is one of
// Options.DetailedDenialSources.
func (s *Server) detailedFor(ctx context.Context) bool {
	if len(s.opts.DetailedDenialSources) == 0 {
		return false
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return false
	}
	src, ok := peerAddr(p.Addr)
	if !ok {
		return false
	}
	for _, pfx := range s.opts.DetailedDenialSources {
		if pfx.Contains(src) {
			return true
		}
	}
	return false
}

// newRequestID returns 16 random hex digits (crypto/rand.Read never fails:
// it ends the program instead).
func newRequestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
