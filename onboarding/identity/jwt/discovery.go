package jwt

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	jose "github.com/go-jose/go-jose/v4"

	"github.com/embark-mesh/embark/onboarding/identity"
)

var _ keySource = (*discoveredKeySet)(nil)

// discoveredKeySet finds an issuer's JWKS by OIDC discovery: go-oidc reads
// <issuer>/.well-known/openid-configuration and checks that the document
// names the configured issuer; its jwks_uri (which must be https) is then
// fetched and cached like a configured jwksUri. Discovery is lazy (an issuer
// that is down at start-up is found later), retried at most every
// minRefresh, and repeated every refresh so that a moved jwks_uri is
// followed.
type discoveredKeySet struct {
	issuer     string
	client     *http.Client
	now        func() time.Time
	refresh    time.Duration
	minRefresh time.Duration
	maxAge     time.Duration
	log        *slog.Logger

	mu           sync.Mutex
	keys         *remoteKeySet // nil until discovery first succeeded
	discoveredAt time.Time
	attempted    time.Time
	lastErr      error
}

func (d *discoveredKeySet) candidates(ctx context.Context, kid string, alg jose.SignatureAlgorithm) ([]jose.JSONWebKey, error) {
	keys, err := d.keySet(ctx)
	if err != nil {
		return nil, err
	}
	return keys.candidates(ctx, kid, alg)
}

// keySet returns the key set of the discovered jwks_uri, discovering it
// first (or again, once refresh has passed) when allowed.
func (d *discoveredKeySet) keySet(ctx context.Context) (*remoteKeySet, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	due := d.keys == nil || now.Sub(d.discoveredAt) >= d.refresh
	mayTry := d.attempted.IsZero() || now.Sub(d.attempted) >= d.minRefresh
	if !due || !mayTry {
		if d.keys != nil {
			return d.keys, nil
		}
		return nil, identity.RefuseWrap(identity.ReasonKeySetUnavailable, d.lastErr, "OIDC discovery of issuer %s failed", d.issuer)
	}
	d.attempted = now
	// One discovery at a time (the lock is held): a handful of requests
	// wait for it rather than each fetching the document.
	jwksURI, err := d.discover(ctx)
	d.lastErr = err
	if err != nil {
		d.log.WarnContext(ctx, "OIDC discovery failed", "issuer", d.issuer, "error", err, "haveKeys", d.keys != nil)
		if d.keys != nil {
			return d.keys, nil // the last good one
		}
		return nil, identity.RefuseWrap(identity.ReasonKeySetUnavailable, err, "OIDC discovery of issuer %s failed", d.issuer)
	}
	d.discoveredAt = now
	if d.keys == nil || d.keys.url != jwksURI {
		d.log.InfoContext(ctx, "OIDC discovery found the issuer's JWKS", "issuer", d.issuer, "jwksUri", jwksURI)
		d.keys = &remoteKeySet{
			url: jwksURI, client: d.client, now: d.now,
			refresh: d.refresh, minRefresh: d.minRefresh, maxAge: d.maxAge, log: d.log,
		}
	}
	return d.keys, nil
}

// discover reads the issuer's discovery document with go-oidc and returns
// its jwks_uri.
func (d *discoveredKeySet) discover(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultFetchTimeout)
	defer cancel()
	provider, err := oidc.NewProvider(oidc.ClientContext(ctx, d.client), d.issuer)
	if err != nil {
		return "", fmt.Errorf("discover issuer %s: %w", d.issuer, err)
	}
	var doc struct {
		JWKSURI string `json:"jwks_uri"`
	}
	if err := provider.Claims(&doc); err != nil {
		return "", fmt.Errorf("read the discovery document of %s: %w", d.issuer, err)
	}
	u, err := url.Parse(doc.JWKSURI)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("the discovery document of %s names jwks_uri %q, not an https URL", d.issuer, doc.JWKSURI)
	}
	return doc.JWKSURI, nil
}
