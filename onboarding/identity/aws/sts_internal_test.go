package aws

import (
	"strings"
	"testing"
)

func TestParseSigV4Authorization(t *testing.T) {
	sig := strings.Repeat("ab", 32)
	tests := []struct {
		name    string
		in      string
		wantErr bool
		want    sigV4Authorization
	}{
		{
			name: "SDK shape",
			in:   "AWS4-HMAC-SHA256 Credential=ASIAX/20260101/us-east-2/sts/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-embark-onboarding-audience, Signature=" + sig,
			want: sigV4Authorization{accessKeyID: "ASIAX", date: "20260101", region: "us-east-2", service: "sts",
				signedHeaders: []string{"content-type", "host", "x-amz-date", "x-embark-onboarding-audience"}, signature: sig},
		},
		{name: "SigV4a", in: "AWS4-ECDSA-P256-SHA256 Credential=ASIAX/20260101/sts/aws4_request, SignedHeaders=host, Signature=" + sig, wantErr: true},
		{name: "repeated component", in: "AWS4-HMAC-SHA256 Credential=A/20260101/r/sts/aws4_request, Credential=B/20260101/r/sts/aws4_request, Signature=" + sig, wantErr: true},
		{name: "extra component", in: "AWS4-HMAC-SHA256 Credential=A/20260101/r/sts/aws4_request, SignedHeaders=host, Signature=" + sig + ", X=1", wantErr: true},
		{name: "unsorted headers", in: "AWS4-HMAC-SHA256 Credential=A/20260101/r/sts/aws4_request, SignedHeaders=x-amz-date;host, Signature=" + sig, wantErr: true},
		{name: "empty header name", in: "AWS4-HMAC-SHA256 Credential=A/20260101/r/sts/aws4_request, SignedHeaders=;host, Signature=" + sig, wantErr: true},
		{name: "short scope", in: "AWS4-HMAC-SHA256 Credential=A/20260101/sts/aws4_request, SignedHeaders=host, Signature=" + sig, wantErr: true},
		{name: "bad signature", in: "AWS4-HMAC-SHA256 Credential=A/20260101/r/sts/aws4_request, SignedHeaders=host, Signature=XYZ", wantErr: true},
		{name: "empty", in: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseSigV4Authorization(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseSigV4Authorization() error = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if got.accessKeyID != tt.want.accessKeyID || got.date != tt.want.date || got.region != tt.want.region ||
				got.service != tt.want.service || got.signature != tt.want.signature ||
				strings.Join(got.signedHeaders, ";") != strings.Join(tt.want.signedHeaders, ";") {
				t.Errorf("parseSigV4Authorization() = %+v, want %+v", *got, tt.want)
			}
		})
	}
}

// FuzzParseSigV4Authorization: the Authorization parser of signed STS
// requests never panics and accepts only well-formed values.
func FuzzParseSigV4Authorization(f *testing.F) {
	f.Add("AWS4-HMAC-SHA256 Credential=ASIAX/20260101/us-east-2/sts/aws4_request, SignedHeaders=host;x-amz-date, Signature=" + strings.Repeat("0", 64))
	f.Add("AWS4-HMAC-SHA256 Credential=/////, SignedHeaders=, Signature=")
	f.Add("Bearer x")
	f.Fuzz(func(t *testing.T, in string) {
		a, err := parseSigV4Authorization(in)
		if err != nil {
			return
		}
		if a.accessKeyID == "" || len(a.signature) != 64 || len(a.signedHeaders) == 0 {
			t.Fatalf("accepted %q as %+v", in, *a)
		}
	})
}
