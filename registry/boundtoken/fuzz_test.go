package boundtoken

import (
	"encoding/base64"
	"strings"
	"testing"
)

// FuzzDecodeBoundClaims: a sidecar token's claims are decoded from bytes a
// client sent (after the API server accepted them, but the decoder must not
// rely on it). Decoding never panics; what it accepts is three
// dot-separated parts whose accessors are consistent.
func FuzzDecode(f *testing.F) {
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	hdr := enc(`{"alg":"RS256","kid":"k"}`)
	for _, payload := range []string{
		`{"jti":"1f2e","exp":1700000000,"kubernetes.io":{"namespace":"ns","secret":{"name":"s","uid":"u-1"},"serviceaccount":{"name":"sa","uid":"u-2"}}}`,
		`{"exp":0,"kubernetes.io":{"namespace":"ns","serviceaccount":{"name":"sa"}}}`,
		`{"exp":-5}`,
		`{"exp":1e300}`,
		`{"exp":"soon"}`,
		`{"kubernetes.io":{"secret":null}}`,
		`{"kubernetes.io":[]}`,
		`[]`,
		`null`,
		``,
	} {
		f.Add(hdr + "." + enc(payload) + ".c2ln")
	}
	f.Add("a.b")
	f.Add("a.b.c.d")
	f.Add("..")
	f.Add("a.!!!.c")
	f.Fuzz(func(t *testing.T, raw string) {
		c, err := Decode(raw)
		if err != nil {
			return
		}
		if n := strings.Count(raw, "."); n != 2 {
			t.Fatalf("Decode(%q) accepted %d dots", raw, n)
		}
		if i := strings.IndexFunc(raw, notBase64URLOrDot); i >= 0 {
			t.Fatalf("Decode(%q) accepted byte %d, %q", raw, i, raw[i])
		}
		if name, uid, ok := c.SecretRef(); !ok && (name != "" || uid != "") {
			t.Fatalf("SecretRef of %q: %q %q without a Secret", raw, name, uid)
		}
		exp, ok := c.ExpiresAt()
		if ok != (c.Expiry > 0) || (ok && exp.Unix() != c.Expiry) {
			t.Fatalf("ExpiresAt of %q = %v %v, exp claim %d", raw, exp, ok, c.Expiry)
		}
	})
}

func notBase64URLOrDot(r rune) bool {
	return !(r == '.' || r == '-' || r == '_' || ('0' <= r && r <= '9') || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z'))
}
