package identity

import (
	"errors"
	"fmt"
	"io"
	"testing"
)

func TestSanitizeDNSLabel(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{name: "already valid", in: "abc-123", want: "abc-123"},
		{name: "uppercase", in: "ABC", want: "abc"},
		{name: "runs collapse", in: "a__b..c", want: "a-b-c"},
		{name: "dash runs collapse", in: "a---b", want: "a-b"},
		{name: "trim", in: "-_a_-", want: "a"},
		{name: "unicode", in: "ünïcödé", want: "n-c-d"},
		{name: "empty", in: "", want: ""},
		{name: "only junk", in: "@@@", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := SanitizeDNSLabel(tt.in); got != tt.want {
				t.Errorf("SanitizeDNSLabel(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestCheckIAMRole(t *testing.T) {
	proven := &Identity{AWS: &AWSIdentity{InstanceID: "i-1", STSProven: true, IAMRole: "ratings-role"}}
	unproven := &Identity{AWS: &AWSIdentity{InstanceID: "i-1"}}
	tests := []struct {
		name       string
		id         *Identity
		allowed    []string
		wantReason Reason
	}{
		{name: "allowed role", id: proven, allowed: []string{"other", "ratings-role"}},
		{name: "any role with proof", id: proven, allowed: nil},
		{name: "another role", id: proven, allowed: []string{"reviews-role"}, wantReason: ReasonRoleMismatch},
		{name: "no sts proof", id: unproven, allowed: []string{"ratings-role"}, wantReason: ReasonSTSProofRequired},
		{name: "no sts proof, any role", id: unproven, wantReason: ReasonSTSProofRequired},
		{name: "jwt identity", id: &Identity{JWT: &JWTIdentity{}}, allowed: []string{"x"}, wantReason: ReasonSTSProofRequired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.id.CheckIAMRole(tt.allowed)
			if got := ReasonOf(err); got != tt.wantReason {
				t.Fatalf("CheckIAMRole() = %v, want reason %q", err, tt.wantReason)
			}
			if tt.wantReason != "" && !errors.Is(err, tt.wantReason) {
				t.Errorf("errors.Is(%v, %s) = false", err, tt.wantReason)
			}
		})
	}
}

func TestVerificationError(t *testing.T) {
	cause := io.ErrUnexpectedEOF
	tests := []struct {
		name      string
		err       error
		wantMsg   string
		wantIs    []error
		wantNotIs []error
	}{
		{
			name:      "without cause",
			err:       Refuse(ReasonExpired, "token expired at %s", "2020-01-01T00:00:00Z"),
			wantMsg:   "Expired: token expired at 2020-01-01T00:00:00Z",
			wantIs:    []error{ReasonExpired},
			wantNotIs: []error{ReasonNotYetValid, cause},
		},
		{
			name:      "with cause",
			err:       RefuseWrap(ReasonMalformed, cause, "decode signature"),
			wantMsg:   "Malformed: decode signature: unexpected EOF",
			wantIs:    []error{ReasonMalformed, cause},
			wantNotIs: []error{ReasonBadSignature},
		},
		{
			name:    "wrapped further",
			err:     fmt.Errorf("verify credential: %w", Refuse(ReasonUnknownRegion, "no certificate for region xx-east-1")),
			wantMsg: "verify credential: UnknownRegion: no certificate for region xx-east-1",
			wantIs:  []error{ReasonUnknownRegion},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.wantMsg {
				t.Errorf("Error() = %q, want %q", got, tt.wantMsg)
			}
			for _, target := range tt.wantIs {
				if !errors.Is(tt.err, target) {
					t.Errorf("errors.Is(err, %v) = false, want true", target)
				}
			}
			for _, target := range tt.wantNotIs {
				if errors.Is(tt.err, target) {
					t.Errorf("errors.Is(err, %v) = true, want false", target)
				}
			}
			var ve *VerificationError
			if !errors.As(tt.err, &ve) {
				t.Fatalf("errors.As(*VerificationError) = false")
			}
		})
	}
	if got := ReasonOf(io.EOF); got != "" {
		t.Errorf("ReasonOf(io.EOF) = %q, want empty", got)
	}
}

func TestReasonsAreDistinct(t *testing.T) {
	seen := map[Reason]bool{}
	for _, r := range Reasons() {
		if r == "" || seen[r] {
			t.Errorf("reason %q empty or duplicated", r)
		}
		seen[r] = true
	}
}
