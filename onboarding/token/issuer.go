package token

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"k8s.io/apimachinery/pkg/util/validation"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/internal/compactjws"
)

// Lifetime and leeway defaults and bounds.
const (
	// DefaultLifetime is the lifetime of a token when none is configured
	// (tokenIssuer.jwt.expiration).
	DefaultLifetime = time.Hour
	// MinLifetime and MaxLifetime bound the configurable lifetime.
	MinLifetime = time.Minute
	MaxLifetime = 24 * time.Hour
	// DefaultLeeway is the clock skew tolerated on exp, nbf and iat.
	DefaultLeeway = 30 * time.Second
	// MaxLeeway bounds the configurable leeway.
	MaxLeeway = 5 * time.Minute
	// MaxTokenLength is the longest token Verify parses and Issue produces.
	// A token is about 1 KiB with an AWS identity; a JWT identity with many
	// attributes or an 8192-bit RSA key makes it longer.
	MaxTokenLength = 16 << 10
	// maxIdentityLength bounds the workload identity and the jti.
	maxIdentityLength = 1024
)

// WorkloadClaimKey is the private claim that carries the WorkloadClaim.
const WorkloadClaimKey = "embark.io/workload"

// ConfirmationSessionKey is the confirmation method, a member of the cnf
// claim (RFC 7800), that binds a token to an agent session: the hex
// SHA-256 of the session key. Whoever presents the token proves the
// session by sending the key itself.
const ConfirmationSessionKey = "embark.io/session-sha256"

// ErrNoSigningKey is returned by Issue while the key source has no key set.
var ErrNoSigningKey = errors.New("no onboarding token signing key loaded")

// Option configures an Issuer.
type Option func(*options)

type options struct {
	lifetime time.Duration
	leeway   time.Duration
	clock    func() time.Time
	logger   *slog.Logger
}

// WithLifetime sets the lifetime of issued tokens (configuration
// tokenIssuer.jwt.expiration). Default DefaultLifetime, also when d is 0 (an
// unset configuration field); otherwise it must be within [MinLifetime,
// MaxLifetime].
func WithLifetime(d time.Duration) Option { return func(o *options) { o.lifetime = d } }

// WithLeeway sets the clock skew tolerated when checking exp, nbf and iat.
// Default DefaultLeeway; it must be within [0, MaxLeeway].
func WithLeeway(d time.Duration) Option { return func(o *options) { o.leeway = d } }

// WithClock sets the clock. Default time.Now.
func WithClock(now func() time.Time) Option {
	return func(o *options) {
		if now != nil {
			o.clock = now
		}
	}
}

// WithLogger sets the logger. Default: a logger that discards everything.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}

// ValidateLifetime says whether d is an acceptable token lifetime, for
// configuration loaders.
func ValidateLifetime(d time.Duration) error {
	if d < MinLifetime || d > MaxLifetime {
		return fmt.Errorf("onboarding token lifetime %s out of range [%s, %s]", d, MinLifetime, MaxLifetime)
	}
	return nil
}

// Issuer issues onboarding tokens with the current key of its KeySource and
// verifies them against the current and previous keys. It is safe for
// concurrent use.
type Issuer struct {
	keys     KeySource
	issuer   string
	audience string
	lifetime time.Duration
	leeway   time.Duration
	now      func() time.Time
	log      *slog.Logger
}

// Verifier is what a consumer of onboarding tokens needs; *Issuer implements
// it.
type Verifier interface {
	Verify(token string) (*Claims, error)
}

var _ Verifier = (*Issuer)(nil)

// NewIssuer returns an Issuer that signs with keys' current key, names
// issuer as iss (the onboarding endpoint's URL) and audience as the only aud
// (this onboarding plane).
func NewIssuer(keys KeySource, issuer, audience string, opts ...Option) (*Issuer, error) {
	o := options{
		lifetime: DefaultLifetime,
		leeway:   DefaultLeeway,
		clock:    time.Now,
		logger:   slog.New(slog.DiscardHandler),
	}
	for _, opt := range opts {
		opt(&o)
	}
	if o.lifetime == 0 {
		o.lifetime = DefaultLifetime
	}
	if keys == nil {
		return nil, errors.New("onboarding token issuer without a key source")
	}
	if err := checkConfigString("issuer", issuer); err != nil {
		return nil, err
	}
	if err := checkConfigString("audience", audience); err != nil {
		return nil, err
	}
	if err := ValidateLifetime(o.lifetime); err != nil {
		return nil, err
	}
	if o.leeway < 0 || o.leeway > MaxLeeway {
		return nil, fmt.Errorf("onboarding token leeway %s out of range [0s, %s]", o.leeway, MaxLeeway)
	}
	return &Issuer{
		keys:     keys,
		issuer:   issuer,
		audience: audience,
		lifetime: o.lifetime,
		leeway:   o.leeway,
		now:      o.clock,
		log:      o.logger,
	}, nil
}

func checkConfigString(what, v string) error {
	if v == "" {
		return fmt.Errorf("onboarding token %s is empty", what)
	}
	if strings.IndexFunc(v, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 || !utf8.ValidString(v) {
		return fmt.Errorf("onboarding token %s %q holds spaces, control characters or invalid UTF-8", what, v)
	}
	return nil
}

// Lifetime returns the lifetime of the tokens the Issuer issues.
func (i *Issuer) Lifetime() time.Duration { return i.lifetime }

// Request says whom a token is issued to. The endpoint fills it only after
// it verified the workload's platform identity and authorized it.
type Request struct {
	// Namespace of the WorkloadGroup and of the WorkloadAutoRegistration: a
	// DNS-1123 label.
	Namespace string
	// Name of the WorkloadAutoRegistration: a DNS-1123 subdomain.
	Name string
	// WorkloadGroup is the name of the WorkloadGroup in Namespace that the
	// workload joins.
	WorkloadGroup string
	// WorkloadIdentity is the stable string form of the verified platform
	// identity, e.g. aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0.
	WorkloadIdentity string
	// Verified is the verified platform identity, as the
	// WorkloadAutoRegistration records it, so that later calls can
	// re-evaluate OnboardingPolicies without the platform credential.
	// Optional; when set, exactly one of AWS and JWT is set. It is copied.
	Verified *runtimev1alpha1.WorkloadIdentity
	// ProvenAddress is the workload address the platform credential proves
	// (an EC2 instance identity document's signed privateIp), in canonical
	// form; empty when it proves none.
	ProvenAddress string
	// SessionHash binds the token to the agent session that asked for it:
	// the hex SHA-256 (64 lowercase hex digits) of the session key the
	// agent sent, carried in the cnf claim (RFC 7800) as
	// ConfirmationSessionKey. Empty: the token is bound to no session.
	SessionHash string
}

// WorkloadClaim is the private claim WorkloadClaimKey.
type WorkloadClaim struct {
	// WorkloadGroup is "<namespace>/<name>" of the WorkloadGroup.
	WorkloadGroup string `json:"workloadGroup"`
	// Identity is the workload's stable identity string.
	Identity string `json:"identity"`
	// Verified is the verified platform identity, if the issuer was given
	// one.
	Verified *runtimev1alpha1.WorkloadIdentity `json:"verified,omitempty"`
	// ProvenAddress is the address the platform credential proves, if any.
	ProvenAddress string `json:"provenAddress,omitempty"`
}

// Claims are the claims of a verified (or just issued) token. Times are in
// UTC, whole seconds.
type Claims struct {
	Issuer   string
	Audience string
	// Subject is "<namespace>/<workload-auto-registration-name>".
	Subject   string
	ID        string
	IssuedAt  time.Time
	NotBefore time.Time
	Expiry    time.Time
	Workload  WorkloadClaim
	// SessionHash is the session the token is bound to (its cnf claim's
	// ConfirmationSessionKey); empty when it is bound to none.
	SessionHash string
	// KeyID is the kid of the key that signed the token.
	KeyID string
}

// Namespace returns the namespace part of Subject.
func (c *Claims) Namespace() string {
	ns, _, _ := strings.Cut(c.Subject, "/")
	return ns
}

// Name returns the WorkloadAutoRegistration name part of Subject.
func (c *Claims) Name() string {
	_, name, _ := strings.Cut(c.Subject, "/")
	return name
}

// WorkloadGroupName returns the name part of Workload.WorkloadGroup.
func (c *Claims) WorkloadGroupName() string {
	_, name, _ := strings.Cut(c.Workload.WorkloadGroup, "/")
	return name
}

// wireClaims is the JSON payload of a token.
type wireClaims struct {
	jwt.Claims
	Workload     *WorkloadClaim `json:"embark.io/workload,omitempty"`
	Confirmation *confirmation  `json:"cnf,omitempty"`
}

// confirmation is the cnf claim.
type confirmation struct {
	SessionHash string `json:"embark.io/session-sha256,omitempty"`
}

// Issue signs a token for req with the current key and returns it with its
// claims.
func (i *Issuer) Issue(req Request) (string, *Claims, error) {
	if err := checkRequest(req); err != nil {
		return "", nil, err
	}
	set := i.keys.KeySet()
	if set == nil {
		return "", nil, ErrNoSigningKey
	}
	key := set.Current()
	jti, err := newTokenID()
	if err != nil {
		return "", nil, err
	}
	now := time.Unix(i.now().Unix(), 0).UTC()
	c := &Claims{
		Issuer:    i.issuer,
		Audience:  i.audience,
		Subject:   req.Namespace + "/" + req.Name,
		ID:        jti,
		IssuedAt:  now,
		NotBefore: now,
		Expiry:    now.Add(i.lifetime),
		Workload: WorkloadClaim{
			WorkloadGroup: req.Namespace + "/" + req.WorkloadGroup,
			Identity:      req.WorkloadIdentity,
			Verified:      req.Verified.DeepCopy(),
			ProvenAddress: req.ProvenAddress,
		},
		SessionHash: req.SessionHash,
		KeyID:       key.id,
	}
	wire := wireClaims{
		Claims: jwt.Claims{
			Issuer:    c.Issuer,
			Subject:   c.Subject,
			Audience:  jwt.Audience{c.Audience},
			Expiry:    jwt.NewNumericDate(c.Expiry),
			NotBefore: jwt.NewNumericDate(c.NotBefore),
			IssuedAt:  jwt.NewNumericDate(c.IssuedAt),
			ID:        c.ID,
		},
		Workload: &c.Workload,
	}
	if c.SessionHash != "" {
		wire.Confirmation = &confirmation{SessionHash: c.SessionHash}
	}
	tok, err := jwt.Signed(key.signer).Claims(wire).Serialize()
	if err != nil {
		return "", nil, fmt.Errorf("sign onboarding token with key %s: %w", key.id, err)
	}
	if len(tok) > MaxTokenLength {
		return "", nil, fmt.Errorf("onboarding token for %s would be %d bytes, longer than %d", c.Subject, len(tok), MaxTokenLength)
	}
	i.log.Debug("issued onboarding token", "sub", c.Subject, "workloadGroup", c.Workload.WorkloadGroup,
		"jti", c.ID, "kid", key.id, "exp", c.Expiry)
	return tok, c, nil
}

func checkRequest(req Request) error {
	if errs := validation.IsDNS1123Label(req.Namespace); len(errs) > 0 {
		return fmt.Errorf("onboarding token namespace %q: %s", req.Namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(req.Name); len(errs) > 0 {
		return fmt.Errorf("onboarding token WorkloadAutoRegistration name %q: %s", req.Name, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(req.WorkloadGroup); len(errs) > 0 {
		return fmt.Errorf("onboarding token WorkloadGroup name %q: %s", req.WorkloadGroup, strings.Join(errs, "; "))
	}
	if !validIdentity(req.WorkloadIdentity) {
		return fmt.Errorf("onboarding token workload identity %q: want 1 to %d printable characters", req.WorkloadIdentity, maxIdentityLength)
	}
	if req.Verified != nil && !validVerified(req.Verified) {
		return errors.New("onboarding token verified identity: want exactly one of aws, jwt, gcp, azure and ecs")
	}
	if req.SessionHash != "" && !validSessionHash(req.SessionHash) {
		return fmt.Errorf("onboarding token session hash %q: want 64 lowercase hex digits", truncate(req.SessionHash))
	}
	return nil
}

// validSessionHash says whether h is a hex SHA-256: 64 lowercase hex
// digits.
func validSessionHash(h string) bool {
	return len(h) == 64 && strings.IndexFunc(h, func(r rune) bool { return (r < '0' || r > '9') && (r < 'a' || r > 'f') }) < 0
}

func validVerified(v *runtimev1alpha1.WorkloadIdentity) bool {
	n := 0
	for _, set := range []bool{v.AWS != nil, v.JWT != nil, v.GCP != nil, v.Azure != nil, v.ECS != nil} {
		if set {
			n++
		}
	}
	return n == 1
}

func validIdentity(s string) bool {
	return s != "" && len(s) <= maxIdentityLength && utf8.ValidString(s) &&
		strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0
}

func newTokenID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate token ID: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// Verify checks a token: its signature against the current and previous keys
// (chosen by kid, with the key's own algorithm), its issuer, its audience
// (exactly this onboarding plane's), its validity period (with the leeway)
// and the shape of its claims. A refusal is an *Error.
func (i *Issuer) Verify(raw string) (*Claims, error) {
	if raw == "" {
		return nil, refuse(ReasonMalformed, "empty token")
	}
	if len(raw) > MaxTokenLength {
		return nil, refuse(ReasonMalformed, "token of %d bytes, longer than %d", len(raw), MaxTokenLength)
	}
	if err := compactjws.Check(raw); err != nil {
		return nil, refuseWrap(ReasonMalformed, err, "not a compact JWS")
	}
	jws, err := jose.ParseSignedCompact(raw, signatureAlgorithms)
	if err != nil {
		var unexpected *jose.ErrUnexpectedSignatureAlgorithm
		if errors.As(err, &unexpected) && unexpected.Got != "" {
			return nil, refuse(ReasonDisallowedAlgorithm, "alg %q is not one of ES256, RS256, EdDSA", truncate(string(unexpected.Got)))
		}
		return nil, refuseWrap(ReasonMalformed, err, "not a compact JWS")
	}
	if len(jws.Signatures) != 1 {
		return nil, refuse(ReasonMalformed, "%d signatures, want 1", len(jws.Signatures))
	}
	header := jws.Signatures[0].Protected
	if typ, ok := header.ExtraHeaders[jose.HeaderType]; ok {
		if s, _ := typ.(string); !strings.EqualFold(s, "JWT") {
			return nil, refuse(ReasonMalformed, "typ %q, want JWT", truncate(fmt.Sprint(typ)))
		}
	}
	set := i.keys.KeySet()
	if set == nil {
		return nil, refuse(ReasonUnknownKey, "no signing key is loaded")
	}
	if header.KeyID == "" {
		return nil, refuse(ReasonUnknownKey, "token header has no kid")
	}
	key := set.lookup(header.KeyID)
	if key == nil {
		return nil, refuse(ReasonUnknownKey, "kid %q is neither the current nor the previous signing key", truncate(header.KeyID))
	}
	if header.Algorithm != string(key.algorithm) {
		return nil, refuse(ReasonDisallowedAlgorithm, "alg %q does not match key %s, which is %s", header.Algorithm, key.id, key.algorithm)
	}
	payload, err := jws.Verify(key.Public())
	if err != nil {
		return nil, refuseWrap(ReasonBadSignature, err, "signature does not verify with key %s", key.id)
	}
	var wire wireClaims
	if err := json.Unmarshal(payload, &wire); err != nil {
		return nil, refuseWrap(ReasonMalformed, err, "claims are not a JSON object of the expected shape")
	}
	return i.checkClaims(&wire, key)
}

func (i *Issuer) checkClaims(w *wireClaims, key *Key) (*Claims, error) {
	if w.Issuer != i.issuer {
		return nil, refuse(ReasonWrongIssuer, "iss %q, want %q", truncate(w.Issuer), i.issuer)
	}
	if len(w.Audience) != 1 || w.Audience[0] != i.audience {
		return nil, refuse(ReasonWrongAudience, "aud %q, want exactly [%q]", truncate(strings.Join(w.Audience, ",")), i.audience)
	}
	if w.Expiry == nil || w.NotBefore == nil || w.IssuedAt == nil {
		return nil, refuse(ReasonMalformed, "exp, nbf and iat are required")
	}
	if !w.Expiry.Time().After(w.NotBefore.Time()) {
		return nil, refuse(ReasonMalformed, "exp is not after nbf")
	}
	now := i.now()
	switch err := w.Claims.ValidateWithLeeway(jwt.Expected{Time: now}, i.leeway); {
	case err == nil:
	case errors.Is(err, jwt.ErrExpired):
		return nil, refuseWrap(ReasonExpired, err, "expired at %s, now %s, leeway %s", w.Expiry.Time().UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), i.leeway)
	case errors.Is(err, jwt.ErrNotValidYet), errors.Is(err, jwt.ErrIssuedInTheFuture):
		return nil, refuseWrap(ReasonNotYetValid, err, "valid from %s (issued %s), now %s, leeway %s",
			w.NotBefore.Time().UTC().Format(time.RFC3339), w.IssuedAt.Time().UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), i.leeway)
	default:
		return nil, refuseWrap(ReasonMalformed, err, "claims")
	}
	if w.ID == "" || len(w.ID) > maxIdentityLength {
		return nil, refuse(ReasonMalformed, "jti missing or too long")
	}
	ns, name, ok := strings.Cut(w.Subject, "/")
	if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return nil, refuse(ReasonMalformed, "sub %q is not <namespace>/<name>", truncate(w.Subject))
	}
	if w.Workload == nil {
		return nil, refuse(ReasonMalformed, "claim %s missing", WorkloadClaimKey)
	}
	groupNS, group, ok := strings.Cut(w.Workload.WorkloadGroup, "/")
	if !ok || groupNS != ns || len(validation.IsDNS1123Subdomain(group)) > 0 {
		return nil, refuse(ReasonMalformed, "claim %s: workloadGroup %q is not %s/<name>", WorkloadClaimKey, truncate(w.Workload.WorkloadGroup), ns)
	}
	if !validIdentity(w.Workload.Identity) {
		return nil, refuse(ReasonMalformed, "claim %s: identity missing or not printable", WorkloadClaimKey)
	}
	if w.Workload.Verified != nil && !validVerified(w.Workload.Verified) {
		return nil, refuse(ReasonMalformed, "claim %s: verified identity has not exactly one of aws, jwt, gcp, azure and ecs", WorkloadClaimKey)
	}
	var session string
	if c := w.Confirmation; c != nil {
		if !validSessionHash(c.SessionHash) {
			return nil, refuse(ReasonMalformed, "claim cnf: %s is not 64 lowercase hex digits", ConfirmationSessionKey)
		}
		session = c.SessionHash
	}
	return &Claims{
		Issuer:      w.Issuer,
		Audience:    w.Audience[0],
		Subject:     w.Subject,
		ID:          w.ID,
		IssuedAt:    w.IssuedAt.Time().UTC(),
		NotBefore:   w.NotBefore.Time().UTC(),
		Expiry:      w.Expiry.Time().UTC(),
		Workload:    *w.Workload,
		SessionHash: session,
		KeyID:       key.id,
	}, nil
}

// truncate shortens attacker-controlled strings quoted in error messages.
func truncate(s string) string {
	const limit = 64
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "..."
}
