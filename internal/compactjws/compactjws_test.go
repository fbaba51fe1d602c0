package compactjws

import (
	"encoding/base64"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		wantErr   string
	}{
		{"three parts", "eyJh.eyJi.c2ln", ""},
		{"all of the alphabet", "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.YQ.YWI", ""},
		{"empty parts", "..", ""},
		{"carriage return in the payload", "eyJh.ey\r\rJi.c2ln", `byte 7 is '\r'`},
		{"line feed in the signature", "eyJh.eyJi.c2\nln", `byte 12 is '\n'`},
		{"padding", "eyJh.eyJi.c2ln==", `byte 14 is '='`},
		{"standard alphabet", "eyJh.ey+i.c2ln", `byte 7 is '+'`},
		{"space", "eyJh .eyJi.c2ln", `byte 4 is ' '`},
		{"unused bits set, two trailing characters", "eyJh.YR.c2ln", `part 2: last character 'R'`},
		{"unused bits set, three trailing characters", "eyJh.eyJi.YWJ", `part 3: last character 'J'`},
		{"a length no bytes encode to", "eyJh.eyJiY.c2ln", "part 2: 5 characters"},
		{"two parts", "eyJh.eyJi", "2 parts, want 3"},
		{"JSON serialization", `{"payload":"x"}`, `byte 0 is '{'`},
		{"four parts", "a.b.c.d", "part 1: 1 characters"},
		{"four canonical parts", "YQ.YQ.YQ.YQ", "4 parts, want 3"},
		{"empty", "", "1 parts, want 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.raw)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Check(%q) = %v, want nil", tc.raw, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Check(%q) = %v, want an error containing %q", tc.raw, err, tc.wantErr)
			}
		})
	}
}

// FuzzCheck: Check accepts exactly the strings whose three parts the strict
// base64url decoder accepts and re-encodes to themselves.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{"eyJh.eyJi.c2ln", "..", "a.b.c", "YR.YQ.YQ", "eyJh.ey\nJi.c2ln", "YWJ.YWI.", "a.b.c.d"} {
		f.Add(s)
	}
	strict := base64.RawURLEncoding.Strict()
	f.Fuzz(func(t *testing.T, raw string) {
		err := Check(raw)
		parts := strings.Split(raw, ".")
		want := len(parts) == 3
		for _, p := range parts {
			b, derr := strict.DecodeString(p)
			if derr != nil || base64.RawURLEncoding.EncodeToString(b) != p {
				want = false
			}
		}
		if (err == nil) != want {
			t.Fatalf("Check(%q) = %v, strict decoding says canonical=%v", raw, err, want)
		}
	})
}
