package tokenauth

import (
	"context"
	"encoding/base64"
	"fmt"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// countingReviewer counts reviews and refuses every token: a token the
// authenticator accepts without it was taken from what Issued remembered.
type countingReviewer struct{ n int }

func (r *countingReviewer) Create(context.Context, *authenticationv1.TokenReview, metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	r.n++
	return &authenticationv1.TokenReview{Status: authenticationv1.TokenReviewStatus{Authenticated: false, Error: "refused by the test"}}, nil
}

// sidecarToken is the shape of a token the API server binds to a Secret;
// its signature is not checked by anything here.
func sidecarToken(t *testing.T, exp time.Time, secret string) string {
	t.Helper()
	enc := base64.RawURLEncoding.EncodeToString
	ref := ""
	if secret != "" {
		ref = fmt.Sprintf(`,"secret":{"name":%q,"uid":"uid-%s"}`, secret, secret)
	}
	payload := fmt.Sprintf(`{"jti":"j-%s","exp":%d,"kubernetes.io":{"namespace":"ns"%s,"serviceaccount":{"name":"sa","uid":"sa-uid"}}}`, secret, exp.Unix(), ref)
	return enc([]byte(`{"alg":"RS256","kid":"k"}`)) + "." + enc([]byte(payload)) + ".c2ln"
}

func TestIssued(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		name      string
		token     string
		audiences []string
		cache     bool
		remember  bool
	}{
		{"a bound token for this audience", sidecarToken(t, now.Add(time.Hour), "s1"), []string{"istio-ca", "xds"}, true, true},
		{"another audience only", sidecarToken(t, now.Add(time.Hour), "s1"), []string{"istio-ca"}, true, false},
		{"bound to no Secret", sidecarToken(t, now.Add(time.Hour), ""), []string{"xds"}, true, false},
		{"expired", sidecarToken(t, now.Add(-time.Second), "s1"), []string{"xds"}, true, false},
		{"not a token", "not.a token", []string{"xds"}, true, false},
		{"no review cache", sidecarToken(t, now.Add(time.Hour), "s1"), []string{"xds"}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reviews := &countingReviewer{}
			opts := Options{Reviews: reviews, Audience: "xds", Clock: func() time.Time { return now }}
			if tc.cache {
				opts.CacheTTL, opts.CacheSize = time.Minute, 16
			}
			a := New(opts)
			a.Issued(tc.token, tc.audiences)
			cred, err := a.Authenticate(context.Background(), tc.token)
			switch {
			case tc.remember && err != nil:
				t.Fatalf("an issued token was not remembered: %v (%d reviews)", err, reviews.n)
			case tc.remember:
				want := Credential{ServiceAccount: types.NamespacedName{Namespace: "ns", Name: "sa"}, SecretName: "s1", SecretUID: "uid-s1", ID: "j-s1", Expires: now.Add(time.Hour)}
				got := *cred
				got.expires = time.Time{}
				if got != want || reviews.n != 0 {
					t.Fatalf("credential %+v after %d reviews, want %+v after none", got, reviews.n, want)
				}
				// Deleting the Secret forgets it: the next use is reviewed.
				a.Forget("uid-s1")
				if _, err := a.Authenticate(context.Background(), tc.token); err == nil || reviews.n != 1 {
					t.Fatalf("after Forget: %v after %d reviews, want the review's refusal", err, reviews.n)
				}
			case err == nil:
				t.Fatalf("a token Issued must not remember was accepted: %+v", cred)
			}
		})
	}
}
