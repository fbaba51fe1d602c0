package ca

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	securityv1alpha1 "istio.io/api/security/v1alpha1"

	"github.com/embark-mesh/embark/xds"
)

func TestCappedValidity(t *testing.T) {
	const day = 24 * time.Hour
	tests := []struct {
		name        string
		asked       int64
		maxValidity time.Duration
		tokenLeft   time.Duration
		want        int64
	}{
		{name: "90 days asked, capped at the token", asked: 90 * 86400, maxValidity: day, tokenLeft: time.Hour, want: 3600},
		{name: "90 days asked, capped at the maximum", asked: 90 * 86400, maxValidity: day, tokenLeft: 48 * time.Hour, want: 86400},
		{name: "less than both keeps its ask", asked: 600, maxValidity: day, tokenLeft: time.Hour, want: 600},
		{name: "unset gets the cap, not istiod's default", asked: 0, maxValidity: day, tokenLeft: 30 * time.Minute, want: 1800},
		{name: "unset with a long token gets the maximum", asked: 0, maxValidity: day, tokenLeft: 72 * time.Hour, want: 86400},
		{name: "a configured maximum over 24h", asked: 7 * 86400, maxValidity: 3 * day, tokenLeft: 10 * day, want: 3 * 86400},
		{name: "fractions of a second round down", asked: 0, maxValidity: day, tokenLeft: 90*time.Second + 900*time.Millisecond, want: 90},
		{name: "a token about to expire still gets a second", asked: 3600, maxValidity: day, tokenLeft: 200 * time.Millisecond, want: 1},
		{name: "an expired token gets a second", asked: 3600, maxValidity: day, tokenLeft: -time.Minute, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CappedValidity(tt.asked, tt.maxValidity, tt.tokenLeft); got != tt.want {
				t.Errorf("CappedValidity(%d, %s, %s) = %d, want %d", tt.asked, tt.maxValidity, tt.tokenLeft, got, tt.want)
			}
		})
	}
}

// recordingUpstream records the validity istiod is asked for.
type recordingUpstream struct{ validity int64 }

func (u *recordingUpstream) Invoke(_ context.Context, _ string, req, resp any, _ ...grpc.CallOption) error {
	u.validity = req.(*securityv1alpha1.IstioCertificateRequest).GetValidityDuration()
	resp.(*securityv1alpha1.IstioCertificateResponse).CertChain = []string{"leaf", "root"}
	return nil
}

func (u *recordingUpstream) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Unimplemented, "no streams")
}

// The relay asks istiod for the capped validity: 90 days asked by a caller
// whose token has 40 minutes left becomes 40 minutes.
func TestRelayAsksIstiodForTheCappedValidity(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name        string
		asked       int64
		maxValidity time.Duration
		want        int64
	}{
		{name: "90 days", asked: 90 * 86400, want: 2400},
		{name: "unset", asked: 0, want: 2400},
		{name: "10 minutes", asked: 600, want: 600},
		{name: "a maximum below the token", asked: 90 * 86400, maxValidity: 15 * time.Minute, want: 900},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := &recordingUpstream{}
			r, err := New(Options{Upstream: up, MaxValidity: tt.maxValidity, Clock: func() time.Time { return now },
				Authorizer: authorizerFunc(func(context.Context) (*xds.CertificateCaller, error) {
					return &xds.CertificateCaller{Token: "t", Expires: now.Add(40 * time.Minute)}, nil
				})})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.CreateCertificate(t.Context(), &securityv1alpha1.IstioCertificateRequest{Csr: "c", ValidityDuration: tt.asked}); err != nil {
				t.Fatal(err)
			}
			if up.validity != tt.want {
				t.Errorf("istiod asked for %ds, want %ds", up.validity, tt.want)
			}
		})
	}
}

func TestMaxValidityIsBounded(t *testing.T) {
	_, err := New(Options{Upstream: absentUpstream{}, Authorizer: authorizerFunc(nil), MaxValidity: MaxValidity + time.Second})
	if err == nil {
		t.Error("New with MaxValidity over 90 days succeeded")
	}
}
