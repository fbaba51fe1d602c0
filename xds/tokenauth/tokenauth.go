// Package tokenauth authenticates the bearer token a VM's sidecar sends on
// its xDS streams and certificate requests: a Kubernetes service-account
// token of the WorkloadGroup's service account, bound to the registration's
// sidecar-credential Secret. A token is reviewed with the API server
// (TokenReview, for Embark's xDS audience) and its positive review cached
// briefly in a bounded LRU; what the review proves is a Credential.
package tokenauth

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

	"github.com/embark-mesh/embark/registry/boundtoken"
)

// Reviewer reviews tokens (client-go's
// AuthenticationV1().TokenReviews() satisfies it).
type Reviewer interface {
	Create(ctx context.Context, review *authenticationv1.TokenReview, opts metav1.CreateOptions) (*authenticationv1.TokenReview, error)
}

// Errors of authentication; the xDS server answers them with Unauthenticated
// (ErrReviewFailed: Unavailable, the sidecar retries).
var (
	ErrNoToken        = errors.New("no sidecar token: send `authorization: Bearer <token>` (the token from the onboarding bootstrap)")
	ErrMalformedToken = errors.New("malformed authorization metadata, want `Bearer <token>`")
	ErrBadToken       = errors.New("sidecar token refused")
	ErrExpiredToken   = errors.New("sidecar token expired; reconnect with the fresh token of the token file")
	ErrNotBound       = errors.New("sidecar token is not bound to a registration's Secret")
	ErrReviewFailed   = errors.New("cannot review the sidecar token right now")
)

// Reasons (metrics labels) of refused streams and certificate requests.
const (
	ReasonNoToken        = "no_token"
	ReasonMalformedToken = "malformed_token"
	ReasonInvalidToken   = "invalid_token"
	ReasonExpiredToken   = "expired_token"
	ReasonUnboundToken   = "unbound_token"
	ReasonReviewFailed   = "review_failed"
)

// Reason is the metrics reason (a label value) of an authentication error.
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrNoToken):
		return ReasonNoToken
	case errors.Is(err, ErrMalformedToken):
		return ReasonMalformedToken
	case errors.Is(err, ErrExpiredToken):
		return ReasonExpiredToken
	case errors.Is(err, ErrNotBound):
		return ReasonUnboundToken
	case errors.Is(err, ErrReviewFailed):
		return ReasonReviewFailed
	default:
		return ReasonInvalidToken
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

// Authenticator reviews bearer tokens with the API server and caches positive
// answers briefly in a bounded LRU.
type Authenticator struct {
	reviews  Reviewer
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

// Options configures an Authenticator. Every field documents its default.
type Options struct {
	// Reviews reviews tokens (the API server's TokenReview). Required.
	Reviews Reviewer
	// Audience every token must carry. Required.
	Audience string
	// CacheTTL is how long a positive review is cached. Zero: no cache.
	CacheTTL time.Duration
	// CacheSize bounds the cached reviews (least recently used dropped
	// first). Zero: no cache.
	CacheSize int
	// Clock tells the time. Default time.Now.
	Clock func() time.Time
}

// New returns an Authenticator configured by opts.
func New(opts Options) *Authenticator {
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	return &Authenticator{reviews: opts.Reviews, audience: opts.Audience, ttl: opts.CacheTTL, size: opts.CacheSize, now: opts.Clock, lru: list.New(), index: map[[32]byte]*list.Element{}}
}

// BearerToken returns the token of the stream's `authorization: Bearer` metadata.
func BearerToken(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return "", ErrNoToken
	}
	scheme, tok, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return "", fmt.Errorf("%w: %w", ErrBadToken, ErrMalformedToken)
	}
	return strings.TrimSpace(tok), nil
}

// Issued remembers raw, a sidecar token this process has just received
// from the API server's TokenRequest (over its own authenticated
// connection) for audiences, as reviewed: the sidecar's first stream and
// its first certificate request, which arrive together right after it
// onboards, then need no TokenReview each (a burst of 500 VMs made two per
// VM). The credential is what a review would have cached, for as long; a
// token not for this authenticator's audience, not bound to a Secret or
// already expired is not remembered, and nothing is remembered without a
// cache. Forget drops it with the Secret.
func (a *Authenticator) Issued(raw string, audiences []string) {
	if a.ttl <= 0 || a.size <= 0 || !slices.Contains(audiences, a.audience) {
		return
	}
	claims, err := boundtoken.Decode(raw)
	if err != nil || claims.Kubernetes.Namespace == "" || claims.Kubernetes.ServiceAccount.Name == "" {
		return
	}
	if c, err := a.credential(claims); err == nil {
		a.store(sha256.Sum256([]byte(raw)), c)
	}
}

// credential is what the claims of a token the API server issued or
// accepted prove, to be cached for the review TTL: it must be bound to a
// Secret and not expired.
func (a *Authenticator) credential(claims *boundtoken.Claims) (*Credential, error) {
	secret, uid, ok := claims.SecretRef()
	if !ok || secret == "" || uid == "" {
		return nil, ErrNotBound
	}
	exp, ok := claims.ExpiresAt()
	if !ok {
		return nil, fmt.Errorf("%w: the token has no expiry (exp)", ErrBadToken)
	}
	now := a.now()
	if !now.Before(exp) {
		return nil, fmt.Errorf("%w at %s", ErrExpiredToken, exp.UTC().Format(time.RFC3339))
	}
	return &Credential{
		ServiceAccount: types.NamespacedName{Namespace: claims.Kubernetes.Namespace, Name: claims.Kubernetes.ServiceAccount.Name},
		SecretName:     secret, SecretUID: uid, ID: claims.ID, Expires: exp,
		expires: now.Add(a.ttl),
	}, nil
}

// Authenticate reviews raw and returns what it proves.
func (a *Authenticator) Authenticate(ctx context.Context, raw string) (*Credential, error) {
	key := sha256.Sum256([]byte(raw))
	if c := a.cached(key); c != nil {
		if !a.now().Before(c.Expires) {
			return nil, fmt.Errorf("%w at %s", ErrExpiredToken, c.Expires.UTC().Format(time.RFC3339))
		}
		return c, nil
	}
	// A bearer that is not even shaped like a service-account token is
	// refused without asking the API server (unauthenticated floods cost
	// no TokenReview); its claims are trusted only after the review below.
	if _, err := boundtoken.Decode(raw); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadToken, err)
	}
	review, err := a.reviews.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{
		Token: raw, Audiences: []string{a.audience},
	}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrReviewFailed, err)
	}
	st := review.Status
	if !st.Authenticated {
		msg := st.Error
		if msg == "" {
			msg = "not authenticated"
		}
		return nil, fmt.Errorf("%w: %s", ErrBadToken, msg)
	}
	if !slices.Contains(st.Audiences, a.audience) {
		return nil, fmt.Errorf("%w: not issued for audience %q", ErrBadToken, a.audience)
	}
	ns, name, ok := serviceAccountOf(st.User.Username)
	if !ok {
		return nil, fmt.Errorf("%w: %q is not a service account", ErrBadToken, st.User.Username)
	}
	// The API server accepted exactly these bytes, so their claims are its own.
	claims, err := boundtoken.Decode(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadToken, err)
	}
	if claims.Kubernetes.Namespace != ns || claims.Kubernetes.ServiceAccount.Name != name {
		return nil, fmt.Errorf("%w: claims name %s/%s, the review %s/%s", ErrBadToken, claims.Kubernetes.Namespace, claims.Kubernetes.ServiceAccount.Name, ns, name)
	}
	if ids := st.User.Extra[credentialIDKey]; len(ids) > 0 && claims.ID != "" && ids[0] != "JTI="+claims.ID {
		return nil, fmt.Errorf("%w: credential id %s does not match the token's jti", ErrBadToken, ids[0])
	}
	// The claims name the review's service account (checked above).
	c, err := a.credential(claims)
	if err != nil {
		return nil, err
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

func (a *Authenticator) cached(key [32]byte) *Credential {
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

func (a *Authenticator) store(key [32]byte, c *Credential) {
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
func (a *Authenticator) sweep() {
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

// Forget drops every cached review of tokens bound to the Secret uid.
func (a *Authenticator) Forget(uid types.UID) {
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
