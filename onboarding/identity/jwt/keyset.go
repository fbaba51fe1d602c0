package jwt

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/embark-mesh/embark/onboarding/identity"
)

// maxJWKSSize bounds a fetched key set.
const maxJWKSSize = 1 << 20

// keySource finds the verification keys of one issuer.
type keySource interface {
	// candidates returns the keys that may have signed a token with this
	// kid ("" = none given) and alg.
	candidates(ctx context.Context, kid string, alg jose.SignatureAlgorithm) ([]jose.JSONWebKey, error)
}

var (
	_ keySource = (*staticKeySet)(nil)
	_ keySource = (*remoteKeySet)(nil)
)

// parseKeySet parses a JWKS document and keeps the public signature keys.
func parseKeySet(data []byte) (*jose.JSONWebKeySet, error) {
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("parse JWKS: %w", err)
	}
	out := &jose.JSONWebKeySet{}
	for _, k := range set.Keys {
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		pub := k.Public()
		if !pub.Valid() {
			continue // symmetric or broken keys
		}
		out.Keys = append(out.Keys, pub)
	}
	if len(out.Keys) == 0 {
		return nil, errors.New("JWKS holds no public signature keys")
	}
	return out, nil
}

// match returns the keys of set usable for kid and alg.
func match(set *jose.JSONWebKeySet, kid string, alg jose.SignatureAlgorithm) []jose.JSONWebKey {
	if set == nil {
		return nil
	}
	var out []jose.JSONWebKey
	for _, k := range set.Keys {
		if kid != "" && k.KeyID != kid {
			continue
		}
		if k.Algorithm != "" && k.Algorithm != string(alg) {
			continue
		}
		if !keyFitsAlgorithm(k.Key, alg) {
			continue
		}
		out = append(out, k)
	}
	return out
}

func keyFitsAlgorithm(key any, alg jose.SignatureAlgorithm) bool {
	switch k := key.(type) {
	case *rsa.PublicKey:
		switch alg {
		case jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512:
			return k.N.BitLen() >= 2048
		}
	case *ecdsa.PublicKey:
		switch alg {
		case jose.ES256:
			return k.Curve == elliptic.P256()
		case jose.ES384:
			return k.Curve == elliptic.P384()
		case jose.ES512:
			return k.Curve == elliptic.P521()
		}
	case ed25519.PublicKey:
		return alg == jose.EdDSA
	}
	return false
}

// staticKeySet is an inline JWKS.
type staticKeySet struct {
	set *jose.JSONWebKeySet
}

func (s *staticKeySet) candidates(_ context.Context, kid string, alg jose.SignatureAlgorithm) ([]jose.JSONWebKey, error) {
	if keys := match(s.set, kid, alg); len(keys) > 0 {
		return keys, nil
	}
	return nil, identity.Refuse(identity.ReasonUnknownKey, "no key of the configured JWKS has kid %q and fits alg %s", kid, alg)
}

// remoteKeySet is a JWKS fetched from a URL and cached.
type remoteKeySet struct {
	url        string
	client     *http.Client
	now        func() time.Time
	refresh    time.Duration
	minRefresh time.Duration
	maxAge     time.Duration // 0: keys never expire
	log        *slog.Logger

	mu        sync.Mutex
	set       *jose.JSONWebKeySet // last good key set
	fetchedAt time.Time           // when set was fetched
	attempted time.Time           // last fetch attempt, good or not
	lastErr   error               // error of the last attempt
	fetching  chan struct{}       // closed when the fetch in flight ends
}

func (r *remoteKeySet) candidates(ctx context.Context, kid string, alg jose.SignatureAlgorithm) ([]jose.JSONWebKey, error) {
	fetched := false // at most one fetch (ours or one we waited for) per call
	for {
		r.mu.Lock()
		now := r.now()
		if r.set != nil && r.maxAge > 0 && now.Sub(r.fetchedAt) >= r.maxAge {
			r.log.WarnContext(ctx, "dropping a JWKS older than the maximum key age", "url", r.url, "fetchedAt", r.fetchedAt, "maxAge", r.maxAge)
			r.set = nil
		}
		keys := match(r.set, kid, alg)
		stale := r.set == nil || now.Sub(r.fetchedAt) >= r.refresh
		if len(keys) > 0 && (!stale || r.fetching != nil) {
			r.mu.Unlock()
			return keys, nil
		}
		if wait := r.fetching; wait != nil && !fetched {
			r.mu.Unlock()
			select {
			case <-wait:
			case <-ctx.Done():
				return nil, identity.RefuseWrap(identity.ReasonKeySetUnavailable, ctx.Err(), "waiting for the JWKS at %s", r.url)
			}
			fetched = true
			continue
		}
		mayFetch := !fetched && r.fetching == nil && (r.attempted.IsZero() || now.Sub(r.attempted) >= r.minRefresh)
		if !mayFetch {
			set, lastErr := r.set, r.lastErr
			r.mu.Unlock()
			switch {
			case len(keys) > 0:
				return keys, nil // stale, but the best there is
			case set == nil:
				return nil, identity.RefuseWrap(identity.ReasonKeySetUnavailable, lastErr, "the JWKS of the issuer could not be fetched from %s", r.url)
			default:
				return nil, identity.Refuse(identity.ReasonUnknownKey, "no key of the JWKS at %s has kid %q and fits alg %s", r.url, kid, alg)
			}
		}
		done := make(chan struct{})
		r.fetching = done
		r.attempted = now
		r.mu.Unlock()

		// The fetch serves every waiting caller: one caller going away must
		// not cancel it. The HTTP client's timeout bounds it.
		set, err := r.fetch(context.WithoutCancel(ctx))

		r.mu.Lock()
		r.lastErr = err
		if err == nil {
			r.set, r.fetchedAt = set, r.now()
		}
		haveCached := r.set != nil
		r.fetching = nil
		close(done)
		r.mu.Unlock()
		if err != nil {
			r.log.WarnContext(ctx, "fetching JWKS failed", "url", r.url, "error", err, "haveCachedKeys", haveCached)
		} else {
			r.log.DebugContext(ctx, "fetched JWKS", "url", r.url, "keys", len(set.Keys))
		}
		fetched = true
	}
}

// maxJWKSRedirects bounds the same-origin redirects a JWKS fetch follows.
const maxJWKSRedirects = 3

// sameOriginClient returns a copy of c that follows only redirects to the
// origin of the first request: a JWKS URL that redirects elsewhere (an
// attacker's host, or a plain-http downgrade) is refused.
func sameOriginClient(c *http.Client) *http.Client {
	cc := *c
	cc.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= maxJWKSRedirects {
			return fmt.Errorf("more than %d redirects", maxJWKSRedirects)
		}
		first := via[0].URL
		if req.URL.Scheme != first.Scheme || req.URL.Host != first.Host {
			return fmt.Errorf("redirect from %s://%s to another origin %s://%s refused", first.Scheme, first.Host, req.URL.Scheme, req.URL.Host)
		}
		return nil
	}
	return &cc
}

func (r *remoteKeySet) fetch(ctx context.Context) (*jose.JSONWebKeySet, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url, nil)
	if err != nil {
		return nil, fmt.Errorf("build JWKS request: %w", err)
	}
	req.Header.Set("Accept", "application/json, application/jwk-set+json")
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch JWKS: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch JWKS: HTTP status %d", resp.StatusCode)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSSize+1))
	if err != nil {
		return nil, fmt.Errorf("read JWKS: %w", err)
	}
	if len(data) > maxJWKSSize {
		return nil, fmt.Errorf("JWKS is larger than %d bytes", maxJWKSSize)
	}
	return parseKeySet(data)
}
