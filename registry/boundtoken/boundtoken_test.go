package boundtoken

import (
	"encoding/base64"
	"testing"
)

func TestDecode(t *testing.T) {
	enc := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	hdr := enc(`{"alg":"RS256","kid":"k"}`)
	payload := enc(`{"jti":"1f2e","exp":1700000000,"kubernetes.io":{"namespace":"ns","secret":{"name":"s","uid":"u-1"},"serviceaccount":{"name":"sa","uid":"u-2"}}}`)
	good := hdr + "." + payload + ".c2ln"

	c, err := Decode(good)
	if err != nil {
		t.Fatalf("Decode(good): %v", err)
	}
	if name, uid, ok := c.SecretRef(); !ok || name != "s" || uid != "u-1" || c.ID != "1f2e" || c.Kubernetes.Namespace != "ns" {
		t.Fatalf("Decode(good) = %+v", c)
	}

	for name, raw := range map[string]string{
		// Another spelling of the same token: Go's base64 would skip the
		// CR and LF, and the review cache would key it apart from good.
		"CR in the payload": hdr + "." + payload[:6] + "\r" + payload[6:] + ".c2ln",
		"LF in the header":  hdr[:3] + "\n" + hdr[3:] + "." + payload + ".c2ln",
		"two parts":         hdr + "." + payload,
		"payload not JSON":  hdr + "." + enc("nope") + ".c2ln",
	} {
		t.Run(name, func(t *testing.T) {
			if c, err := Decode(raw); err == nil {
				t.Fatalf("Decode(%q) = %+v, want an error", raw, c)
			}
		})
	}
}
