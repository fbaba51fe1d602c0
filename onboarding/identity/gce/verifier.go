package gce

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/jwt"
)

const (
	// Issuer is the only issuer of GCE instance identity tokens.
	Issuer = "https://accounts.google.com"
	// DefaultJWKSURL is where Google publishes the keys that sign them.
	DefaultJWKSURL = "https://www.googleapis.com/oauth2/v3/certs"
	// DefaultMaxTokenLifetime is Config.MaxTokenLifetime's default: Google
	// issues tokens valid for one hour.
	DefaultMaxTokenLifetime = time.Hour
)

// Config says which tokens the verifier accepts.
type Config struct {
	// Audiences the token's aud must be one of (the onboarding endpoint's
	// URL or host). Required.
	Audiences []string
	// JWKSURL is where Google's keys are fetched (https). Default
	// DefaultJWKSURL.
	JWKSURL string
	// CACertificates (PEM) are the roots the JWKS is fetched with. Default:
	// the system roots.
	CACertificates []byte
	// MaxTokenLifetime refuses tokens valid for longer (exp minus iat).
	// Default DefaultMaxTokenLifetime.
	MaxTokenLifetime time.Duration
	// InstanceCheck, when set, confirms every instance with the Compute API
	// (a *Checker): it must exist under the token's name with the token's
	// numeric ID, be RUNNING, and have a primary network interface, whose
	// address the identity then proves. Default: not checked, no address
	// proven.
	InstanceCheck InstanceChecker
}

// Verifier verifies GCE instance identity tokens. It is safe for concurrent
// use.
type Verifier struct {
	jwksURL string
	jwt     *jwt.Verifier
	// instances, when not nil, confirms every instance with the Compute
	// API.
	instances InstanceChecker
}

// InstanceChecker asks the Compute API about an instance (*Checker).
type InstanceChecker interface {
	Describe(ctx context.Context, project, zone, name string) (*ComputeInstance, error)
}

var _ InstanceChecker = (*Checker)(nil)

// Gate decides, before the Compute API is asked, whether an instance could
// be admitted if the Compute API confirmed it: claimed is the token's
// identity, marked confirmed. An error stops the verification and is
// returned as it is.
type Gate func(ctx context.Context, claimed *identity.Identity) error

var _ identity.Verifier[string] = (*Verifier)(nil)

// claim paths of a format=full token, by attribute name.
const (
	attrProjectID     = "project_id"
	attrProjectNumber = "project_number"
	attrZone          = "zone"
	attrInstanceID    = "instance_id"
	attrInstanceName  = "instance_name"
	attrCreation      = "instance_creation_timestamp"
	attrEmail         = "email"
	attrEmailVerified = "email_verified"
	attrIssuedAt      = "iat"
)

func claimPaths() map[string]string {
	m := map[string]string{attrEmail: "email", attrEmailVerified: "email_verified", attrIssuedAt: "iat"}
	for _, a := range []string{attrProjectID, attrProjectNumber, attrZone, attrInstanceID, attrInstanceName, attrCreation} {
		m[a] = "google.compute_engine." + a
	}
	return m
}

// NewVerifier returns a Verifier of tokens for cfg.Audiences. The JWKS is
// fetched when first needed. opts are those of the jwt.Verifier it wraps
// (HTTP client, clock, JWKS refresh, logger, used-token cache size, the
// deployment's shared replay record), which also keeps its used tokens.
func NewVerifier(cfg Config, opts ...jwt.Option) (*Verifier, error) {
	if len(cfg.Audiences) == 0 {
		return nil, errors.New("gce identity verifier: at least one audience is required")
	}
	if cfg.JWKSURL == "" {
		cfg.JWKSURL = DefaultJWKSURL
	}
	if cfg.MaxTokenLifetime == 0 {
		cfg.MaxTokenLifetime = DefaultMaxTokenLifetime
	}
	// Google's identity tokens carry no jti; replays are refused here, by
	// the token itself.
	v, err := jwt.NewVerifier([]jwt.IssuerConfig{{
		Issuer: Issuer, ShortName: "gce", Audiences: cfg.Audiences, JWKSURL: cfg.JWKSURL,
		CACertificates: cfg.CACertificates, MaxTokenLifetime: cfg.MaxTokenLifetime,
		AllowTokensWithoutJTI: true, Attributes: claimPaths(),
	}}, opts...)
	if err != nil {
		return nil, fmt.Errorf("gce identity verifier: %w", err)
	}
	return &Verifier{jwksURL: cfg.JWKSURL, jwt: v, instances: cfg.InstanceCheck}, nil
}

// JWKSURL is where the verifier fetches Google's keys.
func (v *Verifier) JWKSURL() string { return v.jwksURL }

// Verify verifies token and returns the instance identity it proves.
func (v *Verifier) Verify(ctx context.Context, token string) (*identity.Identity, error) {
	return v.VerifyGated(ctx, token, nil)
}

// VerifyGated is Verify, with gate (when not nil) asked after the token
// verified and before the Compute API is asked: an instance no policy could
// admit costs no Compute API call (the calls are rate limited for every
// caller).
func (v *Verifier) VerifyGated(ctx context.Context, token string, gate Gate) (*identity.Identity, error) {
	id, err := v.jwt.Verify(ctx, token)
	if err != nil {
		return nil, err
	}
	gce, err := parseIdentity(id.JWT.Attributes)
	if err != nil {
		return nil, err
	}
	gce.Expiry = id.JWT.Expiry.UTC()
	if v.instances != nil {
		if gate != nil {
			claimed := *gce
			claimed.InstanceConfirmed = true
			if err := gate(ctx, &identity.Identity{Method: identity.MethodGCEInstanceIdentityToken, GCE: &claimed}); err != nil {
				return nil, err
			}
		}
		if err := v.confirm(ctx, gce); err != nil {
			return nil, err
		}
	}
	// Last, once everything else holds: a refused token is not used up.
	fresh, err := v.jwt.ReserveToken(ctx, "gce", token, gce.Expiry)
	if err != nil {
		return nil, fmt.Errorf("check the instance identity token of instance %s against the ones already used: %w", gce.InstanceID, err)
	}
	if !fresh {
		return nil, identity.Refuse(identity.ReasonReplayed, "instance identity token of instance %s (project %s) was already used: every onboarding needs a freshly issued token", gce.InstanceID, gce.ProjectID)
	}
	return &identity.Identity{Method: identity.MethodGCEInstanceIdentityToken, GCE: gce}, nil
}

// confirm asks the Compute API about the token's instance and fills in the
// address it reports.
func (v *Verifier) confirm(ctx context.Context, g *identity.GCEIdentity) error {
	in, err := v.instances.Describe(ctx, g.ProjectID, g.Zone, g.InstanceName)
	switch {
	case errors.Is(err, ErrInstanceNotFound):
		return identity.RefuseWrap(identity.ReasonInstanceNotRunning, err, "the Compute API does not know instance %s (project %s, zone %s)", g.InstanceName, g.ProjectID, g.Zone)
	case err != nil:
		return identity.RefuseWrap(identity.ReasonInstanceCheckUnavailable, err, "ask the Compute API about instance %s (project %s, zone %s)", g.InstanceName, g.ProjectID, g.Zone)
	case in.ID != g.InstanceID:
		return identity.Refuse(identity.ReasonInstanceReplaced, "the Compute API reports instance %s (project %s, zone %s) with ID %s, the token's is %s: the token's instance was deleted and another created under its name",
			g.InstanceName, g.ProjectID, g.Zone, in.ID, g.InstanceID)
	case in.Status != "RUNNING":
		return identity.Refuse(identity.ReasonInstanceNotRunning, "the Compute API reports instance %s (project %s, zone %s) %s, not RUNNING", g.InstanceName, g.ProjectID, g.Zone, clip(in.Status))
	case in.NetworkIP == "":
		return identity.Refuse(identity.ReasonInstanceNoAddress, "the Compute API reports no internal address (networkIP of nic0) for instance %s (project %s, zone %s)", g.InstanceName, g.ProjectID, g.Zone)
	}
	g.Address, g.InstanceConfirmed = in.NetworkIP, true
	return nil
}
