package awstest

// An independent implementation of the checking side of AWS Signature
// Version 4 (header-based), as STS applies it. It deliberately shares no
// code with the SDK's signer, so that the fake checks the SDK rather than
// agreeing with it by construction.

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

type sigV4 struct {
	accessKeyID   string
	date          string
	region        string
	service       string
	signedHeaders []string
	signature     string
}

func (s *sigV4) scope() string {
	return s.date + "/" + s.region + "/" + s.service + "/aws4_request"
}

func parseSigV4(v string) (*sigV4, error) {
	const prefix = "AWS4-HMAC-SHA256 "
	rest, ok := strings.CutPrefix(v, prefix)
	if !ok {
		return nil, errors.New("authorization header requires AWS4-HMAC-SHA256")
	}
	var s sigV4
	var haveCred, haveSigned, haveSig bool
	for part := range strings.SplitSeq(rest, ",") {
		k, val, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "Credential":
			f := strings.Split(val, "/")
			if len(f) != 5 || f[4] != "aws4_request" {
				return nil, fmt.Errorf("credential should be scoped to a valid region: %q", val)
			}
			s.accessKeyID, s.date, s.region, s.service = f[0], f[1], f[2], f[3]
			haveCred = true
		case "SignedHeaders":
			s.signedHeaders = strings.Split(val, ";")
			haveSigned = true
		case "Signature":
			s.signature = val
			haveSig = true
		default:
			return nil, fmt.Errorf("authorization header has an unknown component %q", k)
		}
	}
	if !haveCred || !haveSigned || !haveSig {
		return nil, errors.New("authorization header requires 'Credential', 'Signature' and 'SignedHeaders' parameters")
	}
	return &s, nil
}

// uriEncode is RFC 3986 percent-encoding of everything but unreserved
// characters.
func uriEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == '~' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

func canonicalQuery(q url.Values) string {
	var pairs []string
	for k, vs := range q {
		for _, v := range vs {
			pairs = append(pairs, uriEncode(k)+"="+uriEncode(v))
		}
	}
	sort.Strings(pairs)
	return strings.Join(pairs, "&")
}

func canonicalHeaderValue(vs []string) string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = strings.Join(strings.Fields(v), " ")
	}
	return strings.Join(out, ",")
}

// canonicalRequest builds SigV4's canonical request of r as received.
func canonicalRequest(r *http.Request, body []byte, signed []string) (string, error) {
	if !sort.StringsAreSorted(signed) {
		return "", errors.New("SignedHeaders must be sorted")
	}
	var hb strings.Builder
	for _, name := range signed {
		if name != strings.ToLower(name) || name == "" {
			return "", fmt.Errorf("signed header name %q is not lower case", name)
		}
		var vs []string
		switch name {
		case "host":
			vs = []string{r.Host}
		case "content-length":
			vs = []string{strconv.FormatInt(r.ContentLength, 10)}
		default:
			vs = r.Header.Values(name)
		}
		if len(vs) == 0 {
			return "", fmt.Errorf("signed header %s is missing from the request", name)
		}
		hb.WriteString(name + ":" + canonicalHeaderValue(vs) + "\n")
	}
	sum := sha256.Sum256(body)
	path := r.URL.EscapedPath()
	if path == "" {
		path = "/"
	}
	return strings.Join([]string{
		r.Method,
		path,
		canonicalQuery(r.URL.Query()),
		hb.String(),
		strings.Join(signed, ";"),
		hex.EncodeToString(sum[:]),
	}, "\n"), nil
}

func hmacSHA256(key []byte, data string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(data))
	return h.Sum(nil)
}

// expectedSignature computes the signature SigV4 requires for canonical.
func expectedSignature(secret, amzDate string, s *sigV4, canonical string) string {
	sum := sha256.Sum256([]byte(canonical))
	toSign := "AWS4-HMAC-SHA256\n" + amzDate + "\n" + s.scope() + "\n" + hex.EncodeToString(sum[:])
	key := hmacSHA256([]byte("AWS4"+secret), s.date)
	key = hmacSHA256(key, s.region)
	key = hmacSHA256(key, s.service)
	key = hmacSHA256(key, "aws4_request")
	return hex.EncodeToString(hmacSHA256(key, toSign))
}
