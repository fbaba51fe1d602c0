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

type authorizerFunc func(context.Context) (*xds.CertificateCaller, error)

func (f authorizerFunc) AuthorizeCertificate(ctx context.Context) (*xds.CertificateCaller, error) {
	return f(ctx)
}

func TestRelayRefusesBeforeIstiod(t *testing.T) {
	denied := authorizerFunc(func(context.Context) (*xds.CertificateCaller, error) {
		return nil, status.Error(codes.PermissionDenied, "registration ns/x does not exist; onboard again")
	})
	tests := []struct {
		name     string
		req      *securityv1alpha1.IstioCertificateRequest
		requests int // sent before req
		rate     float64
		wantCode codes.Code
		wantMsg  string
	}{
		{name: "too large", req: &securityv1alpha1.IstioCertificateRequest{Csr: strings.Repeat("x", 20<<10)}, wantCode: codes.InvalidArgument, wantMsg: "exceeds the limit"},
		{name: "no CSR", req: &securityv1alpha1.IstioCertificateRequest{}, wantCode: codes.InvalidArgument, wantMsg: "without a CSR"},
		{name: "negative validity", req: &securityv1alpha1.IstioCertificateRequest{Csr: "c", ValidityDuration: -1}, wantCode: codes.InvalidArgument, wantMsg: "validity"},
		{name: "validity beyond bound", req: &securityv1alpha1.IstioCertificateRequest{Csr: "c", ValidityDuration: 1 << 40}, wantCode: codes.InvalidArgument, wantMsg: "validity"},
		{name: "caller refused", req: &securityv1alpha1.IstioCertificateRequest{Csr: "c"}, wantCode: codes.PermissionDenied, wantMsg: "onboard again"},
		{name: "over the rate", req: &securityv1alpha1.IstioCertificateRequest{Csr: "c"}, requests: 3, rate: 0.001, wantCode: codes.ResourceExhausted, wantMsg: "rate limit"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(Options{Upstream: noUpstream{t}, Authorizer: denied, Rate: tt.rate, Burst: 3})
			if err != nil {
				t.Fatal(err)
			}
			for range tt.requests {
				_, _ = r.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: "c"})
			}
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
