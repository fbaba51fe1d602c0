package ca

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/embark-mesh/embark/xds"
)

// noUpstream fails the test if a request reaches istiod: every case here
// must be refused before.
type noUpstream struct{ t *testing.T }

func (u noUpstream) Invoke(context.Context, string, any, any, ...grpc.CallOption) error {
	u.t.Error("a refused request reached istiod")
	return status.Error(codes.Internal, "unexpected")
}

func (u noUpstream) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	u.t.Error("unexpected stream")
	return nil, status.Error(codes.Internal, "unexpected")
}

// absentUpstream answers every request Unavailable, as an istiod that is
// not there: a request that reaches it passed Embark's checks.
type absentUpstream struct{}

func (absentUpstream) Invoke(context.Context, string, any, any, ...grpc.CallOption) error {
	return status.Error(codes.Unavailable, "istiod absent")
}

func (absentUpstream) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Unavailable, "istiod absent")
}

type authorizerFunc func(context.Context) (*xds.CertificateCaller, error)

func (f authorizerFunc) AuthorizeCertificate(ctx context.Context) (*xds.CertificateCaller, error) {
	return f(ctx)
}

func TestRelayRefusesBeforeIstiod(t *testing.T) {
	denied := authorizerFunc(func(context.Context) (*xds.CertificateCaller, error) {
		return nil, status.Error(codes.PermissionDenied, "registration ns/x does not exist; onboard again")
	})
	allowed := authorizerFunc(func(context.Context) (*xds.CertificateCaller, error) {
		return &xds.CertificateCaller{Token: "t"}, nil
	})
	tests := []struct {
		name     string
		req      *securityv1alpha1.IstioCertificateRequest
		requests int // sent before req
		// before authorizes the requests sent before req (default denied),
		// auth req itself (default denied).
		before, auth Authorizer
		rate         float64
		wantCode     codes.Code
		wantMsg      string
	}{
		{name: "too large", req: &securityv1alpha1.IstioCertificateRequest{Csr: strings.Repeat("x", 20<<10)}, wantCode: codes.InvalidArgument, wantMsg: "exceeds the limit"},
		{name: "no CSR", req: &securityv1alpha1.IstioCertificateRequest{}, wantCode: codes.InvalidArgument, wantMsg: "without a CSR"},
		{name: "negative validity", req: &securityv1alpha1.IstioCertificateRequest{Csr: "c", ValidityDuration: -1}, wantCode: codes.InvalidArgument, wantMsg: "validity"},
		{name: "validity beyond bound", req: &securityv1alpha1.IstioCertificateRequest{Csr: "c", ValidityDuration: 1 << 40}, wantCode: codes.InvalidArgument, wantMsg: "validity"},
		{name: "caller refused", req: &securityv1alpha1.IstioCertificateRequest{Csr: "c"}, wantCode: codes.PermissionDenied, wantMsg: "onboard again"},
		{name: "over the rate", req: &securityv1alpha1.IstioCertificateRequest{Csr: "c"}, requests: 3, before: allowed, auth: allowed, rate: 0.001, wantCode: codes.ResourceExhausted, wantMsg: "rate limit"},
		// Refused callers spend none of the shared budget (the attack is
		// test/adversarial TestUnauthenticatedFloodStarvesCertificateRequests).
		{name: "refused callers do not spend the rate", req: &securityv1alpha1.IstioCertificateRequest{Csr: "c"}, requests: 10, auth: allowed, rate: 0.001, wantCode: codes.Unavailable, wantMsg: "istiod absent"},
		{name: "over the rate, caller refused first", req: &securityv1alpha1.IstioCertificateRequest{Csr: "c"}, requests: 3, before: allowed, rate: 0.001, wantCode: codes.PermissionDenied, wantMsg: "onboard again"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, auth := tt.before, tt.auth
			if before == nil {
				before = denied
			}
			if auth == nil {
				auth = denied
			}
			// Only an allowed caller may reach istiod (absent here).
			var up grpc.ClientConnInterface = noUpstream{t}
			if tt.before != nil || tt.auth != nil {
				up = absentUpstream{}
			}
			current := before
			r, err := New(Options{Upstream: up, Authorizer: authorizerFunc(func(ctx context.Context) (*xds.CertificateCaller, error) {
				return current.AuthorizeCertificate(ctx)
			}), Rate: tt.rate, Burst: 3})
			if err != nil {
				t.Fatal(err)
			}
			for range tt.requests {
				_, _ = r.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: "c"})
			}
			current = auth
			_, err = r.CreateCertificate(t.Context(), tt.req)
			if status.Code(err) != tt.wantCode || !strings.Contains(status.Convert(err).Message(), tt.wantMsg) {
				t.Errorf("CreateCertificate = %v, want %s containing %q", err, tt.wantCode, tt.wantMsg)
			}
		})
	}
}

func TestNewNeedsUpstreamAndAuthorizer(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Error("New without Upstream and Authorizer succeeded")
	}
}
