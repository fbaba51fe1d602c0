package xds

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"
)

// FuzzParseNodeID: the node ID comes from the proxy. Parsing never panics,
// and what it accepts names exactly one registration.
func FuzzParseNodeID(f *testing.F) {
	for _, seed := range []string{
		"sidecar~10.0.0.1~ratings-aws-1.ns~ns.svc.cluster.local",
		"sidecar~fd00::1~a.b~b.svc.cluster.local",
		"router~10.0.0.1~x.y~y.svc.cluster.local",
		"sidecar~10.0.0.1~a.b.c~b.svc.cluster.local",
		"sidecar~10.0.0.1~a.b~c.svc.cluster.local",
		"sidecar~~.~",
		"sidecar~10.0.0.1~a.b~b~extra",
		"",
		"~~~",
		"sidecar~10.0.0.1~ä.ß~ß",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, id string) {
		info, err := ParseNodeID(id)
		if err != nil {
			if !strings.Contains(err.Error(), "node ID") {
				t.Fatalf("ParseNodeID(%q): error %q does not say what it parsed", id, err)
			}
			return
		}
		key := info.Registration
		switch {
		case info.Type != "sidecar":
			t.Fatalf("ParseNodeID(%q) accepted type %q", id, info.Type)
		case key.Name == "" || key.Namespace == "":
			t.Fatalf("ParseNodeID(%q) accepted an empty name: %+v", id, key)
		case strings.Contains(key.Name, ".") || strings.Contains(key.Namespace, "."):
			t.Fatalf("ParseNodeID(%q): ambiguous %+v", id, key)
		case strings.Contains(info.IP, "~") || strings.Contains(key.Name, "~") || strings.Contains(key.Namespace, "~"):
			t.Fatalf("ParseNodeID(%q): a field holds the separator: %+v", id, info)
		case !strings.HasPrefix(id, "sidecar~"+info.IP+"~"+key.Name+"."+key.Namespace+"~"+key.Namespace):
			t.Fatalf("ParseNodeID(%q) = %+v, which is not what the ID says", id, info)
		}
	})
}

// FuzzBearerToken: the authorization metadata comes from the client.
// Extracting the token never panics; it either names what is wrong or
// returns a non-empty, trimmed token that followed a Bearer scheme.
func FuzzBearerToken(f *testing.F) {
	for _, seed := range []string{
		"Bearer eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln",
		"bearer abc",
		"BEARER  abc  ",
		"Bearer ",
		"Bearer",
		"Basic dXNlcjpwYXNz",
		"",
		" Bearer abc",
		"Bearer\tabc",
		"Bearer a b c",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, header string) {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", header))
		tok, err := bearerToken(ctx)
		if err != nil {
			if !errors.Is(err, errMalformedToken) && !errors.Is(err, errNoToken) {
				t.Fatalf("bearerToken(%q): unexpected error kind %v", header, err)
			}
			if authReason(err) != reasonMalformedToken && authReason(err) != reasonNoToken {
				t.Fatalf("bearerToken(%q): error %v counted as %s", header, err, authReason(err))
			}
			return
		}
		scheme, _, _ := strings.Cut(header, " ")
		switch {
		case tok == "" || tok != strings.TrimSpace(tok):
			t.Fatalf("bearerToken(%q) = %q: empty or untrimmed", header, tok)
		case !strings.EqualFold(scheme, "Bearer"):
			t.Fatalf("bearerToken(%q) = %q without a Bearer scheme", header, tok)
		case !strings.HasSuffix(strings.TrimSpace(header), tok):
			t.Fatalf("bearerToken(%q) = %q, not the header's token", header, tok)
		}
	})
	// No metadata at all.
	if _, err := bearerToken(context.Background()); !errors.Is(err, errNoToken) {
		f.Fatalf("no metadata: %v, want errNoToken", err)
	}
}
