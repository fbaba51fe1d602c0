package xds

import (
	"container/list"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/metadata"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/embark-mesh/embark/registry"
)

// TokenReviewer reviews tokens (client-go's
// AuthenticationV1().TokenReviews() satisfies it).
type TokenReviewer interface {
	Create(ctx context.Context, review *authenticationv1.TokenReview, opts metav1.CreateOptions) (*authenticationv1.TokenReview, error)
}

// Errors of authentication; the server answers them with Unauthenticated.
var (
	errNoToken        = errors.New("no sidecar token: send `authorization: Bearer <token>` (the token from the onboarding bootstrap)")
	errMalformedToken = errors.New("malformed authorization metadata, want `Bearer <token>`")
	errBadToken       = errors.New("sidecar token refused")
	errExpiredToken   = errors.New("sidecar token expired; reconnect with the fresh token of the token file")
	errNotBound       = errors.New("sidecar token is not bound to a registration's Secret")
	errReviewFailed   = errors.New("cannot review the sidecar token right now")
)

// Reasons (metrics labels) of refused streams, besides those of authorize.
const (
	reasonNoToken        = "no_token"
	reasonMalformedToken = "malformed_token"
	reasonInvalidToken   = "invalid_token"
	reasonExpiredToken   = "expired_token"
	reasonUnboundToken   = "unbound_token"
	reasonReviewFailed   = "review_failed"
)

// authReason is the metrics reason of an authentication error.
func authReason(err error) string {
	switch {
	case errors.Is(err, errNoToken):
		return reasonNoToken
	case errors.Is(err, errMalformedToken):
		return reasonMalformedToken
	case errors.Is(err, errExpiredToken):
		return reasonExpiredToken
	case errors.Is(err, errNotBound):
		return reasonUnboundToken
	case errors.Is(err, errReviewFailed):
		return reasonReviewFailed
	default:
		return reasonInvalidToken
	}
}

// credentialIDKey is the TokenReview extra of a service-account token's jti.
const credentialIDKey = "authentication.kubernetes.io/credential-id"

// Credential is what a reviewed sidecar token proves.
type Credential struct {
	// ServiceAccount the token authenticates as.
	ServiceAccount types.NamespacedName
	// SecretName and SecretUID are the Secret the token is bound to.
	SecretName string
	SecretUID  types.UID
	// ID is the token's jti.
	ID string
	// Expires is the token's exp: a stream it opened is closed then.
	Expires time.Time
	// expires is when the cached review of this token must be redone.
	expires time.Time
}

// authenticator reviews bearer tokens with the API server and caches positive
// answers briefly in a bounded LRU.
type authenticator struct {
	reviews  TokenReviewer
	audience string
	ttl      time.Duration
	size     int
	now      func() time.Time

	mu       sync.Mutex
	lru      *list.List // of *cacheEntry, most recent first
	index    map[[32]byte]*list.Element
	sweeping bool // a sweep of expired reviews is scheduled
}

type cacheEntry struct {
	key  [32]byte
	cred *Credential
}

func newAuthenticator(reviews TokenReviewer, audience string, ttl time.Duration, size int, now func() time.Time) *authenticator {
	return &authenticator{reviews: reviews, audience: audience, ttl: ttl, size: size, now: now, lru: list.New(), index: map[[32]byte]*list.Element{}}
}

// bearerToken returns the token of the stream's `authorization: Bearer` metadata.
func bearerToken(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return "", errNoToken
	}
	scheme, tok, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return "", fmt.Errorf("%w: %w", errBadToken, errMalformedToken)
	}
	return strings.TrimSpace(tok), nil
}

// authenticate reviews raw and returns what it proves.
func (a *authenticator) authenticate(ctx context.Context, raw string) (*Credential, error) {
	key := sha256.Sum256([]byte(raw))
	if c := a.cached(key); c != nil {
		if !a.now().Before(c.Expires) {
			return nil, fmt.Errorf("%w at %s", errExpiredToken, c.Expires.UTC().Format(time.RFC3339))
		}
		return c, nil
	}
	// A bearer that is not even shaped like a service-account token is
	// refused without asking the API server (unauthenticated floods cost
	// no TokenReview); its claims are trusted only after the review below.
	if _, err := registry.DecodeBoundClaims(raw); err != nil {
		return nil, fmt.Errorf("%w: %w", errBadToken, err)
	}
	review, err := a.reviews.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{
		Token: raw, Audiences: []string{a.audience},
	}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errReviewFailed, err)
	}
	st := review.Status
	if !st.Authenticated {
		msg := st.Error
		if msg == "" {
			msg = "not authenticated"
		}
		return nil, fmt.Errorf("%w: %s", errBadToken, msg)
	}
	if !slices.Contains(st.Audiences, a.audience) {
		return nil, fmt.Errorf("%w: not issued for audience %q", errBadToken, a.audience)
	}
	ns, name, ok := serviceAccountOf(st.User.Username)
	if !ok {
		return nil, fmt.Errorf("%w: %q is not a service account", errBadToken, st.User.Username)
	}
	// The API server accepted exactly these bytes, so their claims are its own.
	claims, err := registry.DecodeBoundClaims(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errBadToken, err)
	}
	if claims.Kubernetes.Namespace != ns || claims.Kubernetes.ServiceAccount.Name != name {
		return nil, fmt.Errorf("%w: claims name %s/%s, the review %s/%s", errBadToken, claims.Kubernetes.Namespace, claims.Kubernetes.ServiceAccount.Name, ns, name)
	}
	if ids := st.User.Extra[credentialIDKey]; len(ids) > 0 && claims.ID != "" && ids[0] != "JTI="+claims.ID {
		return nil, fmt.Errorf("%w: credential id %s does not match the token's jti", errBadToken, ids[0])
	}
	secret, uid, ok := claims.SecretRef()
	if !ok || secret == "" || uid == "" {
		return nil, errNotBound
	}
	exp, ok := claims.ExpiresAt()
	if !ok {
		return nil, fmt.Errorf("%w: the token has no expiry (exp)", errBadToken)
	}
	now := a.now()
	if !now.Before(exp) {
		return nil, fmt.Errorf("%w at %s", errExpiredToken, exp.UTC().Format(time.RFC3339))
	}
	c := &Credential{
		ServiceAccount: types.NamespacedName{Namespace: ns, Name: name},
		SecretName:     secret, SecretUID: uid, ID: claims.ID, Expires: exp,
		expires: now.Add(a.ttl),
	}
	a.store(key, c)
	return c, nil
}

func serviceAccountOf(username string) (ns, name string, ok bool) {
	rest, ok := strings.CutPrefix(username, "system:serviceaccount:")
	if !ok {
		return "", "", false
	}
	ns, name, ok = strings.Cut(rest, ":")
	return ns, name, ok && ns != "" && name != ""
}

func (a *authenticator) cached(key [32]byte) *Credential {
	if a.ttl <= 0 {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	el, ok := a.index[key]
	if !ok {
		return nil
	}
	e := el.Value.(*cacheEntry)
	if !a.now().Before(e.cred.expires) {
		a.lru.Remove(el)
		delete(a.index, key)
		return nil
	}
	a.lru.MoveToFront(el)
	return e.cred
}

func (a *authenticator) store(key [32]byte, c *Credential) {
	if a.ttl <= 0 || a.size <= 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if el, ok := a.index[key]; ok {
		el.Value.(*cacheEntry).cred = c
		a.lru.MoveToFront(el)
		return
	}
	a.index[key] = a.lru.PushFront(&cacheEntry{key: key, cred: c})
	for a.lru.Len() > a.size {
		last := a.lru.Back()
		a.lru.Remove(last)
		delete(a.index, last.Value.(*cacheEntry).key)
	}
	if !a.sweeping {
		a.sweeping = true
		time.AfterFunc(a.ttl, a.sweep)
	}
}

// sweep drops the reviews that may no longer be reused, so that a server
// whose streams are all open holds none (a stream keeps only what it needs
// of its credential); it runs again every ttl while any review is left.
func (a *authenticator) sweep() {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	for el := a.lru.Front(); el != nil; {
		next := el.Next()
		if e := el.Value.(*cacheEntry); !now.Before(e.cred.expires) {
			a.lru.Remove(el)
			delete(a.index, e.key)
		}
		el = next
	}
	if a.lru.Len() == 0 {
		a.sweeping = false
		return
	}
	time.AfterFunc(a.ttl, a.sweep)
}

// forget drops every cached review of tokens bound to the Secret uid.
func (a *authenticator) forget(uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for el := a.lru.Front(); el != nil; {
		next := el.Next()
		if e := el.Value.(*cacheEntry); e.cred.SecretUID == uid {
			a.lru.Remove(el)
			delete(a.index, e.key)
		}
		el = next
	}
}
