package aws

import (
	"fmt"
	"strings"
	"testing"
	"time"
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

func TestReplayCache(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name string
		max  int
		run  func(t *testing.T, c *replayCache)
	}{
		{
			name: "second reservation refused until expiry",
			max:  10,
			run: func(t *testing.T, c *replayCache) {
				if !c.reserve("a", now.Add(time.Minute), now) {
					t.Fatal("first reservation refused")
				}
				if c.reserve("a", now.Add(time.Minute), now.Add(30*time.Second)) {
					t.Fatal("replay within expiry accepted")
				}
				if !c.reserve("a", now.Add(3*time.Minute), now.Add(2*time.Minute)) {
					t.Fatal("reservation after expiry refused")
				}
			},
		},
		{
			name: "release forgets",
			max:  10,
			run: func(t *testing.T, c *replayCache) {
				c.reserve("a", now.Add(time.Minute), now)
				c.release("a")
				if !c.reserve("a", now.Add(time.Minute), now) {
					t.Fatal("released key refused")
				}
			},
		},
		{
			name: "bounded: expired entries dropped first, then the soonest to expire",
			max:  3,
			run: func(t *testing.T, c *replayCache) {
				c.reserve("old", now.Add(time.Second), now)
				c.reserve("b", now.Add(10*time.Minute), now)
				c.reserve("c", now.Add(5*time.Minute), now)
				later := now.Add(time.Minute)
				c.reserve("d", later.Add(10*time.Minute), later) // drops "old"
				if c.len() != 3 {
					t.Fatalf("%d entries, want 3", c.len())
				}
				c.reserve("e", later.Add(10*time.Minute), later) // evicts "c"
				if c.len() != 3 {
					t.Fatalf("%d entries, want 3", c.len())
				}
				if c.reserve("b", later.Add(time.Minute), later) {
					t.Fatal("kept key accepted again")
				}
				if !c.reserve("c", later.Add(time.Minute), later) {
					t.Fatal("evicted key still refused")
				}
			},
		},
		{
			// Steady onboarding: expired signatures do not pile up until
			// max, the cache holds about what the window covers.
			name: "expired entries dropped as it grows, below max",
			max:  100_000,
			run: func(t *testing.T, c *replayCache) {
				const window = time.Minute // 60 live entries at one per second
				for i := range 10_000 {
					at := now.Add(time.Duration(i) * time.Second)
					if !c.reserve(fmt.Sprint("sig-", i), at.Add(window), at) {
						t.Fatalf("reservation %d refused", i)
					}
				}
				if n := c.len(); n > 2*60+minPrune {
					t.Fatalf("%d entries after 10,000 reservations with 60 unexpired, want at most %d", n, 2*60+minPrune)
				}
				last := now.Add(9_999 * time.Second)
				if c.reserve("sig-9990", last.Add(window), last) {
					t.Fatal("unexpired key dropped by the prune")
				}
			},
		},
		{
			name: "disabled",
			max:  0,
			run: func(t *testing.T, c *replayCache) {
				c.reserve("a", now.Add(time.Minute), now)
				if !c.reserve("a", now.Add(time.Minute), now) {
					t.Fatal("disabled cache refused")
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.run(t, newReplayCache(tt.max))
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
