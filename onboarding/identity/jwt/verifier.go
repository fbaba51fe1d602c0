package jwt

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	josejwt "github.com/go-jose/go-jose/v4/jwt"

	"github.com/embark-mesh/embark/internal/compactjws"
	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/replay"
)

// Defaults of the options.
const (
	// DefaultLeeway is the clock leeway for exp, nbf and iat.
	DefaultLeeway = time.Minute
	// DefaultRefreshInterval is how long a fetched JWKS is used before it is
	// fetched again.
	DefaultRefreshInterval = time.Hour
	// DefaultMinRefreshInterval is the least time between two fetches of one
	// JWKS, whatever tokens arrive.
	DefaultMinRefreshInterval = 30 * time.Second
	// DefaultFetchTimeout bounds one JWKS fetch with the default HTTP client.
	DefaultFetchTimeout = 10 * time.Second
	// DefaultMaxKeyAge is how long after its last successful fetch a JWKS
	// is still used while the issuer cannot be reached; older keys are
	// dropped (a key the issuer revoked must not live forever).
	DefaultMaxKeyAge = 24 * time.Hour
	// MaxTokenSize is the largest token accepted.
	MaxTokenSize = 16 << 10
	// DefaultMaxTokenLifetime is IssuerConfig.MaxTokenLifetime's default.
	DefaultMaxTokenLifetime = time.Hour
	// DefaultReplayCacheSize bounds the jti replay cache (WithReplayCacheSize).
	DefaultReplayCacheSize = 100_000
)

// AllowedAlgorithms are the only signature algorithms accepted.
var AllowedAlgorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512,
	jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512,
	jose.EdDSA,
}

type issuer struct {
	cfg  IssuerConfig
	keys keySource
}

// Verifier verifies JWTs of the configured issuers. It is safe for
// concurrent use.
type Verifier struct {
	issuers map[string]*issuer
	now     func() time.Time
	leeway  time.Duration
	// used remembers the jti of every accepted token until it expires.
	used *replay.Cache
	// shared, when set, records every accepted jti for all the
	// deployment's replicas.
	shared replay.Shared
}

var _ identity.Verifier[string] = (*Verifier)(nil)

type options struct {
	httpClient *http.Client
	now        func() time.Time
	leeway     time.Duration
	refresh    time.Duration
	minRefresh time.Duration
	maxKeyAge  time.Duration
	logger     *slog.Logger
	replaySize int
	shared     replay.Shared
}

// Option configures a Verifier.
type Option func(*options)

// WithHTTPClient sets the client that fetches JWKS URLs. Default: a client
// with a DefaultFetchTimeout timeout. Whatever the client's own redirect
// policy, a JWKS fetch follows only redirects to the same origin (scheme,
// host and port) as the JWKS URL, at most 3.
func WithHTTPClient(c *http.Client) Option { return func(o *options) { o.httpClient = c } }

// WithClock sets the verifier's clock. Default: time.Now.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithLeeway sets the clock leeway for exp, nbf and iat. Default:
// DefaultLeeway.
func WithLeeway(d time.Duration) Option { return func(o *options) { o.leeway = d } }

// WithJWKSRefresh sets how long a fetched JWKS is used (default
// DefaultRefreshInterval) and the least time between two fetches of one
// JWKS (default DefaultMinRefreshInterval), which also limits refetches
// caused by unknown kids.
func WithJWKSRefresh(refresh, minRefresh time.Duration) Option {
	return func(o *options) { o.refresh, o.minRefresh = refresh, minRefresh }
}

// WithMaxKeyAge sets how long after its last successful fetch a JWKS is
// still used when refetching fails. Default DefaultMaxKeyAge; it is at
// least the refresh interval.
func WithMaxKeyAge(d time.Duration) Option { return func(o *options) { o.maxKeyAge = d } }

// WithReplayCacheSize bounds how many used jti values are remembered (per
// verifier, so per endpoint replica). At capacity the one that expires
// soonest is forgotten. Default: DefaultReplayCacheSize.
func WithReplayCacheSize(n int) Option { return func(o *options) { o.replaySize = n } }

// WithLogger sets the logger. Default: discard.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithSharedReplay makes the verifier record every accepted (issuer, jti)
// in store, shared by every replica of the deployment, and refuse a token
// another replica (or this one) already accepted. Default: none, replays
// are refused by this verifier's own cache only.
func WithSharedReplay(store replay.Shared) Option { return func(o *options) { o.shared = store } }

func (o *options) setDefaults() error {
	if o.httpClient == nil {
		o.httpClient = &http.Client{Timeout: DefaultFetchTimeout}
	}
	if o.now == nil {
		o.now = time.Now
	}
	if o.leeway == 0 {
		o.leeway = DefaultLeeway
	}
	if o.refresh == 0 {
		o.refresh = DefaultRefreshInterval
	}
	if o.maxKeyAge == 0 {
		o.maxKeyAge = DefaultMaxKeyAge
	}
	if o.maxKeyAge < o.refresh {
		o.maxKeyAge = o.refresh
	}
	if o.minRefresh == 0 {
		o.minRefresh = DefaultMinRefreshInterval
	}
	if o.leeway < 0 || o.refresh < 0 || o.minRefresh < 0 {
		return errors.New("leeway and refresh intervals must not be negative")
	}
	if o.minRefresh > o.refresh {
		return fmt.Errorf("minimum JWKS refresh interval %s is longer than the refresh interval %s", o.minRefresh, o.refresh)
	}
	if o.logger == nil {
		o.logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.replaySize <= 0 {
		o.replaySize = DefaultReplayCacheSize
	}
	return nil
}

// NewVerifier returns a Verifier trusting issuers. Inline key sets are
// parsed now; key sets at URLs are fetched when first needed.
func NewVerifier(issuers []IssuerConfig, opts ...Option) (*Verifier, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.setDefaults(); err != nil {
		return nil, fmt.Errorf("jwt identity verifier: %w", err)
	}
	v := &Verifier{issuers: make(map[string]*issuer), now: o.now, leeway: o.leeway, used: replay.New(o.replaySize), shared: o.shared}
	shortNames := map[string]bool{}
	for _, cfg := range issuers {
		if err := cfg.validate(); err != nil {
			return nil, fmt.Errorf("jwt identity verifier: %w", err)
		}
		if v.issuers[cfg.Issuer] != nil {
			return nil, fmt.Errorf("jwt identity verifier: issuer %q configured twice", cfg.Issuer)
		}
		if shortNames[cfg.ShortName] {
			return nil, fmt.Errorf("jwt identity verifier: shortName %q used by two issuers", cfg.ShortName)
		}
		shortNames[cfg.ShortName] = true
		if cfg.MaxTokenLifetime == 0 {
			cfg.MaxTokenLifetime = DefaultMaxTokenLifetime
		}
		is := &issuer{cfg: cfg}
		httpClient := o.httpClient
		if len(cfg.CACertificates) > 0 {
			httpClient = clientWithRoots(o.httpClient, cfg.CACertificates)
		}
		switch {
		case len(cfg.JWKS) == 0 && cfg.JWKSURL == "":
			is.keys = &discoveredKeySet{
				issuer: cfg.Issuer, client: sameOriginClient(httpClient), now: o.now,
				refresh: o.refresh, minRefresh: o.minRefresh, maxAge: o.maxKeyAge,
				log: o.logger.With("issuer", cfg.Issuer),
			}
		case len(cfg.JWKS) > 0:
			set, err := parseKeySet(cfg.JWKS)
			if err != nil {
				return nil, fmt.Errorf("jwt identity verifier: issuer %q: %w", cfg.Issuer, err)
			}
			is.keys = &staticKeySet{set: set}
		default:
			is.keys = &remoteKeySet{
				url: cfg.JWKSURL, client: sameOriginClient(httpClient), now: o.now,
				refresh: o.refresh, minRefresh: o.minRefresh, maxAge: o.maxKeyAge,
				log: o.logger.With("issuer", cfg.Issuer),
			}
		}
		v.issuers[cfg.Issuer] = is
	}
	return v, nil
}

// joseHeader is the part of a JOSE header read before go-jose parses the
// token, to name a refused algorithm precisely.
type joseHeader struct {
	Alg string `json:"alg"`
}

func refuseAlg(alg string) error {
	switch {
	case alg == "" || strings.EqualFold(alg, "none"):
		return identity.Refuse(identity.ReasonDisallowedAlgorithm, "token alg %q: unsigned tokens are refused", alg)
	case strings.HasPrefix(strings.ToUpper(alg), "HS"):
		return identity.Refuse(identity.ReasonDisallowedAlgorithm, "token alg %s: HMAC (shared-secret) tokens are refused; only asymmetric algorithms are accepted", alg)
	case !slices.Contains(AllowedAlgorithms, jose.SignatureAlgorithm(alg)):
		return identity.Refuse(identity.ReasonDisallowedAlgorithm, "token alg %q is not one of RS256/384/512, PS256/384/512, ES256/384/512, EdDSA", alg)
	}
	return nil
}

// Verify verifies token and returns the identity it proves.
func (v *Verifier) Verify(ctx context.Context, token string) (*identity.Identity, error) {
	if len(token) > MaxTokenSize {
		return nil, identity.Refuse(identity.ReasonMalformed, "token is %d bytes, more than %d", len(token), MaxTokenSize)
	}
	if err := compactjws.Check(token); err != nil {
		return nil, identity.RefuseWrap(identity.ReasonMalformed, err, "token is not a signed JWT in compact serialization")
	}
	parts := strings.Split(token, ".")
	rawHeader, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return nil, identity.RefuseWrap(identity.ReasonMalformed, err, "token header is not base64url")
	}
	var hdr joseHeader
	if err := json.Unmarshal(rawHeader, &hdr); err != nil {
		return nil, identity.RefuseWrap(identity.ReasonMalformed, err, "token header is not a JSON object")
	}
	if err := refuseAlg(hdr.Alg); err != nil {
		return nil, err
	}
	tok, err := josejwt.ParseSigned(token, AllowedAlgorithms)
	if err != nil {
		return nil, identity.RefuseWrap(identity.ReasonMalformed, err, "parse token")
	}
	if len(tok.Headers) != 1 {
		return nil, identity.Refuse(identity.ReasonMalformed, "token has %d signatures, want 1", len(tok.Headers))
	}
	header := tok.Headers[0]
	alg := jose.SignatureAlgorithm(header.Algorithm)
	if err := refuseAlg(header.Algorithm); err != nil {
		return nil, err
	}

	var unverified struct {
		Issuer string `json:"iss"`
	}
	if err := tok.UnsafeClaimsWithoutVerification(&unverified); err != nil {
		return nil, identity.RefuseWrap(identity.ReasonMalformed, err, "token claims are not a JSON object")
	}
	is, ok := v.issuers[unverified.Issuer]
	if !ok {
		return nil, identity.Refuse(identity.ReasonUnknownIssuer, "token issuer %q is not a configured issuer", truncate(unverified.Issuer, 200))
	}

	keys, err := is.keys.candidates(ctx, header.KeyID, alg)
	if err != nil {
		return nil, err
	}
	var payload []byte
	var sigErr error
	for _, k := range keys {
		var raw json.RawMessage
		if err := tok.Claims(k.Key, &raw); err != nil {
			sigErr = err
			continue
		}
		payload = raw
		break
	}
	if payload == nil {
		return nil, identity.RefuseWrap(identity.ReasonBadSignature, sigErr, "token signature does not verify with the key(s) of issuer %s for kid %q", is.cfg.Issuer, header.KeyID)
	}
	return v.checkClaims(ctx, is, payload)
}

func (v *Verifier) checkClaims(ctx context.Context, is *issuer, payload []byte) (*identity.Identity, error) {
	var claims josejwt.Claims
	if err := json.Unmarshal(payload, &claims); err != nil {
		return nil, identity.RefuseWrap(identity.ReasonMalformed, err, "token claims")
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var raw map[string]any
	if err := dec.Decode(&raw); err != nil {
		return nil, identity.RefuseWrap(identity.ReasonMalformed, err, "token claims")
	}
	now := v.now()
	if claims.Issuer != is.cfg.Issuer {
		return nil, identity.Refuse(identity.ReasonUnknownIssuer, "token issuer %q is not %q", claims.Issuer, is.cfg.Issuer)
	}
	if claims.Expiry == nil {
		return nil, identity.Refuse(identity.ReasonMalformed, "token has no exp")
	}
	if exp := claims.Expiry.Time(); !now.Before(exp.Add(v.leeway)) {
		return nil, identity.Refuse(identity.ReasonExpired, "token expired at %s (now %s, leeway %s)", exp.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), v.leeway)
	}
	if claims.NotBefore != nil {
		if nbf := claims.NotBefore.Time(); now.Add(v.leeway).Before(nbf) {
			return nil, identity.Refuse(identity.ReasonNotYetValid, "token is not valid before %s (now %s, leeway %s)", nbf.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), v.leeway)
		}
	}
	if claims.IssuedAt != nil {
		if iat := claims.IssuedAt.Time(); now.Add(v.leeway).Before(iat) {
			return nil, identity.Refuse(identity.ReasonNotYetValid, "token was issued in the future, at %s (now %s, leeway %s)", iat.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), v.leeway)
		}
	}
	if !slices.ContainsFunc(is.cfg.Audiences, claims.Audience.Contains) {
		return nil, identity.Refuse(identity.ReasonWrongAudience, "token audience %v contains none of issuer %s's audiences %v", []string(claims.Audience), is.cfg.Issuer, is.cfg.Audiences)
	}
	if claims.Subject == "" {
		return nil, identity.Refuse(identity.ReasonMalformed, "token has no sub")
	}
	subject := claims.Subject
	if p := is.cfg.SubjectPrefix; p != "" {
		if !strings.HasPrefix(subject, p) || len(subject) == len(p) {
			return nil, identity.Refuse(identity.ReasonWrongSubject, "token sub %q does not start with issuer %s's subjectPrefix %q followed by a subject", truncate(subject, 200), is.cfg.Issuer, p)
		}
		subject = strings.TrimPrefix(subject, p)
	}
	if err := v.checkLifetime(is, &claims, now); err != nil {
		return nil, err
	}
	// Last, once everything else holds: a refused token does not use up
	// its jti.
	if err := v.checkReplay(ctx, is, &claims, now); err != nil {
		return nil, err
	}
	return &identity.Identity{
		Method: identity.MethodJWT,
		JWT: &identity.JWTIdentity{
			Issuer:     is.cfg.Issuer,
			ShortName:  is.cfg.ShortName,
			Subject:    subject,
			Attributes: extractAttributes(raw, is.cfg.Attributes),
			Expiry:     claims.Expiry.Time(),
		},
	}, nil
}

// checkLifetime refuses a token valid for longer than the issuer allows,
// counted from its iat, else its nbf, else now.
func (v *Verifier) checkLifetime(is *issuer, claims *josejwt.Claims, now time.Time) error {
	start, from := now, "now"
	switch {
	case claims.IssuedAt != nil:
		start, from = claims.IssuedAt.Time(), "iat"
	case claims.NotBefore != nil:
		start, from = claims.NotBefore.Time(), "nbf"
	}
	if life := claims.Expiry.Time().Sub(start); life > is.cfg.MaxTokenLifetime {
		return identity.Refuse(identity.ReasonLifetimeTooLong, "token is valid for %s from its %s, longer than issuer %s's maxTokenLifetime %s: issue shorter-lived tokens",
			life, from, is.cfg.Issuer, is.cfg.MaxTokenLifetime)
	}
	return nil
}

// checkReplay accepts each (issuer, jti) once until the token expires: once
// per verifier, and once per deployment when a shared store is set.
func (v *Verifier) checkReplay(ctx context.Context, is *issuer, claims *josejwt.Claims, now time.Time) error {
	if claims.ID == "" {
		if is.cfg.AllowTokensWithoutJTI {
			return nil
		}
		return identity.Refuse(identity.ReasonMalformed, "token has no jti: issuer %s's tokens must carry one so that a replay can be refused (or set allowTokensWithoutJTI)", is.cfg.Issuer)
	}
	if len(claims.ID) > maxJTILength {
		return identity.Refuse(identity.ReasonMalformed, "token jti is %d bytes, more than %d", len(claims.ID), maxJTILength)
	}
	key, expiry := is.cfg.Issuer+"\x00"+claims.ID, claims.Expiry.Time().Add(v.leeway)
	replayed := identity.Refuse(identity.ReasonReplayed, "token jti %q of issuer %s was already used: every onboarding needs a freshly issued token", truncate(claims.ID, 100), is.cfg.Issuer)
	if !v.used.Reserve(key, expiry, now) {
		return replayed
	}
	if v.shared == nil {
		return nil
	}
	fresh, err := v.shared.Reserve(ctx, "jwt\x00"+key, expiry)
	if err != nil {
		v.used.Release(key) // nothing was decided: the agent may retry the token
		return fmt.Errorf("check token jti %q of issuer %s against the ones already used: %w", truncate(claims.ID, 100), is.cfg.Issuer, err)
	}
	if !fresh {
		return replayed
	}
	return nil
}

// ReserveToken records token as used until its expiry (plus the leeway),
// in this verifier's used-token cache and, with WithSharedReplay, in the
// shared record under scope, and says whether it was not used before. A
// verifier of tokens without a jti (AllowTokensWithoutJTI: a cloud's
// instance or managed identity tokens, package gce and azure) refuses a
// replay by the token itself with it: the key is a hash of the token's
// signature. It is called last, once everything else about the token
// holds, so that a refused token is not used up; when the shared record
// cannot answer the token is released here too (nothing was decided: the
// agent may retry it) and the error wraps replay.ErrUnavailable.
func (v *Verifier) ReserveToken(ctx context.Context, scope, token string, expiry time.Time) (bool, error) {
	sum := sha256.Sum256([]byte(token[strings.LastIndexByte(token, '.')+1:]))
	key, until := scope+"\x00"+hex.EncodeToString(sum[:]), expiry.Add(v.leeway)
	if !v.used.Reserve(key, until, v.now()) {
		return false, nil
	}
	if v.shared == nil {
		return true, nil
	}
	fresh, err := v.shared.Reserve(ctx, key, until)
	if err != nil {
		v.used.Release(key)
		return false, err
	}
	return fresh, nil
}

// maxJTILength bounds what the replay cache keeps per token.
const maxJTILength = 256

// clientWithRoots is base with its TLS roots replaced by the PEM roots.
func clientWithRoots(base *http.Client, pemRoots []byte) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemRoots)
	c := *base
	var tr *http.Transport
	if t, ok := base.Transport.(*http.Transport); ok && t != nil {
		tr = t.Clone()
	} else {
		tr = http.DefaultTransport.(*http.Transport).Clone()
	}
	if tr.TLSClientConfig == nil {
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	tr.TLSClientConfig.RootCAs = pool
	c.Transport = tr
	return &c
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
