package refusal

import (
	"errors"
	"io"
	"testing"
)

type reason string

func (r reason) Error() string { return string(r) }

type refused struct {
	reason reason
	detail string
	err    error
}

func (e *refused) Error() string   { return Message(e.reason, e.detail, e.err) }
func (e *refused) Unwrap() []error { return Unwrap(e.reason, e.err) }

func TestMessageAndUnwrap(t *testing.T) {
	tests := []struct {
		name      string
		err       *refused
		wantMsg   string
		wantCause bool
	}{
		{name: "reason only", err: &refused{reason: "Expired"}, wantMsg: "Expired"},
		{name: "with detail", err: &refused{reason: "Expired", detail: "exp 10:00 is past"}, wantMsg: "Expired: exp 10:00 is past"},
		{name: "with cause", err: &refused{reason: "KeySetUnavailable", detail: "fetch keys", err: io.ErrUnexpectedEOF},
			wantMsg: "KeySetUnavailable: fetch keys: unexpected EOF", wantCause: true},
		{name: "cause without detail", err: &refused{reason: "KeySetUnavailable", err: io.ErrUnexpectedEOF},
			wantMsg: "KeySetUnavailable: unexpected EOF", wantCause: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.wantMsg {
				t.Errorf("Error() = %q, want %q", got, tt.wantMsg)
			}
			if !errors.Is(tt.err, tt.err.reason) {
				t.Error("errors.Is(err, its reason) = false")
			}
			if errors.Is(tt.err, reason("Other")) {
				t.Error("errors.Is(err, another reason) = true")
			}
			if got := errors.Is(tt.err, io.ErrUnexpectedEOF); got != tt.wantCause {
				t.Errorf("errors.Is(err, its cause) = %v, want %v", got, tt.wantCause)
			}
		})
	}
}
