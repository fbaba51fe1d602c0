package tokenauth

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"
)

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
		tok, err := BearerToken(ctx)
		if err != nil {
			if !errors.Is(err, ErrMalformedToken) && !errors.Is(err, ErrNoToken) {
				t.Fatalf("BearerToken(%q): unexpected error kind %v", header, err)
			}
			if Reason(err) != ReasonMalformedToken && Reason(err) != ReasonNoToken {
				t.Fatalf("BearerToken(%q): error %v counted as %s", header, err, Reason(err))
			}
			return
		}
		scheme, _, _ := strings.Cut(header, " ")
		switch {
		case tok == "" || tok != strings.TrimSpace(tok):
			t.Fatalf("BearerToken(%q) = %q: empty or untrimmed", header, tok)
		case !strings.EqualFold(scheme, "Bearer"):
			t.Fatalf("BearerToken(%q) = %q without a Bearer scheme", header, tok)
		case !strings.HasSuffix(strings.TrimSpace(header), tok):
			t.Fatalf("BearerToken(%q) = %q, not the header's token", header, tok)
		}
	})
	// No metadata at all.
	if _, err := BearerToken(context.Background()); !errors.Is(err, ErrNoToken) {
		f.Fatalf("no metadata: %v, want ErrNoToken", err)
	}
}
