package azure

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/jwt"
)

const (
	// TenantPlaceholder in Config.JWKSURL is replaced by each tenant's ID.
	TenantPlaceholder = "{tenant}"
	// DefaultJWKSURL is where Microsoft publishes the keys that sign a
	// tenant's tokens (the jwks_uri of its OpenID configuration).
	DefaultJWKSURL = "https://login.microsoftonline.com/" + TenantPlaceholder + "/discovery/v2.0/keys"
	// DefaultMaxTokenLifetime is Config.MaxTokenLifetime's default: Entra ID
	// issues managed identity tokens valid for about 24 hours (iat is set
	// five minutes before nbf).
	DefaultMaxTokenLifetime = 25 * time.Hour
)

// IssuersOf are the two issuers of a tenant's access tokens: Entra ID's v1
// (what the Instance Metadata Service issues unless the resource's
// application asks for v2) and v2 issuers.
func IssuersOf(tenant string) []string {
	return []string{"https://sts.windows.net/" + tenant + "/", "https://login.microsoftonline.com/" + tenant + "/v2.0"}
}

// Config says which tokens the verifier accepts.
type Config struct {
	// Tenants are the Entra ID tenant IDs (GUIDs) whose tokens are
	// accepted; the issuer of a token must be one of theirs. Required.
	Tenants []string
	// Audiences the token's aud must be one of: the resource the agent asks
	// the Instance Metadata Service for (the application ID URI of the
	// onboarding endpoint's Entra application, e.g. api://embark-onboarding,
	// or its application ID for v2 tokens). Required.
	Audiences []string
	// JWKSURL is where a tenant's keys are fetched (https), with
	// TenantPlaceholder for the tenant ID. Default DefaultJWKSURL.
	JWKSURL string
	// CACertificates (PEM) are the roots the JWKS is fetched with. Default:
	// the system roots.
	CACertificates []byte
	// MaxTokenLifetime refuses tokens valid for longer (exp minus iat).
	// Default DefaultMaxTokenLifetime.
	MaxTokenLifetime time.Duration
	// VMCheck, when set, confirms every VM with Azure Resource Manager
	// (identity.azure.vmCheck): the VM exists, provisioned, with the
	// token's principal as its system-assigned identity; its location, VM
	// ID and primary private address are then part of the identity.
	// Default: not confirmed.
	VMCheck VMChecker
}

// Verifier verifies Azure managed identity tokens. It is safe for
// concurrent use.
type Verifier struct {
	jwksURL string
	// tenantOf maps each accepted issuer to its tenant.
	tenantOf map[string]string
	jwt      *jwt.Verifier
	// vms, when not nil, confirms every VM with Azure Resource Manager.
	vms VMChecker
}

var (
	_ identity.Verifier[string] = (*Verifier)(nil)
	_ VMChecker                 = (*Checker)(nil)
)

// VMChecker asks Azure Resource Manager about a VM (*Checker).
type VMChecker interface {
	Describe(ctx context.Context, id VMResourceID) (*VMDescription, error)
}

// Gate decides, before Resource Manager is asked, whether a VM could be
// admitted if Resource Manager confirmed it: claimed is the identity the
// token proves, not yet confirmed. An error stops the verification and is
// returned as it is.
type Gate func(ctx context.Context, claimed *identity.Identity) error

// NewVerifier returns a Verifier of tokens of cfg.Tenants for
// cfg.Audiences. The JWKS are fetched when first needed. opts are those of
// the jwt.Verifier it wraps (HTTP client, clock, JWKS refresh, logger,
// used-token cache size, the deployment's shared replay record), which also
// keeps its used tokens.
func NewVerifier(cfg Config, opts ...jwt.Option) (*Verifier, error) {
	if len(cfg.Tenants) == 0 {
		return nil, errors.New("azure identity verifier: at least one tenant is required")
	}
	if len(cfg.Audiences) == 0 {
		return nil, errors.New("azure identity verifier: at least one audience is required")
	}
	if cfg.JWKSURL == "" {
		cfg.JWKSURL = DefaultJWKSURL
	}
	if cfg.MaxTokenLifetime == 0 {
		cfg.MaxTokenLifetime = DefaultMaxTokenLifetime
	}
	tenantOf := map[string]string{}
	var issuers []jwt.IssuerConfig
	for _, t := range cfg.Tenants {
		if !guidRE.MatchString(t) {
			return nil, fmt.Errorf("azure identity verifier: tenant %q is not a tenant ID (GUID)", t)
		}
		t = strings.ToLower(t)
		keys := strings.ReplaceAll(cfg.JWKSURL, TenantPlaceholder, t)
		for i, iss := range IssuersOf(t) {
			if tenantOf[iss] != "" {
				return nil, fmt.Errorf("azure identity verifier: tenant %s listed twice", t)
			}
			tenantOf[iss] = t
			// Entra ID's access tokens carry uti, not jti; replays are
			// refused here, by the token itself.
			issuers = append(issuers, jwt.IssuerConfig{
				Issuer: iss, ShortName: fmt.Sprintf("azure-v%d-%s", i+1, t), Audiences: cfg.Audiences, JWKSURL: keys,
				CACertificates: cfg.CACertificates, MaxTokenLifetime: cfg.MaxTokenLifetime,
				AllowTokensWithoutJTI: true, Attributes: claimPaths(),
			})
		}
	}
	v, err := jwt.NewVerifier(issuers, opts...)
	if err != nil {
		return nil, fmt.Errorf("azure identity verifier: %w", err)
	}
	return &Verifier{jwksURL: cfg.JWKSURL, tenantOf: tenantOf, jwt: v, vms: cfg.VMCheck}, nil
}

// JWKSURL is where the verifier fetches Microsoft's keys ({tenant} for
// each tenant's ID).
func (v *Verifier) JWKSURL() string { return v.jwksURL }

// Verify verifies token and returns the VM identity it proves. A token
// already used is refused (identity.ReasonReplayed).
func (v *Verifier) Verify(ctx context.Context, token string) (*identity.Identity, error) {
	return v.VerifyRenewal(ctx, token, nil)
}

// VerifyRenewal is Verify, except that a token already used, and valid
// otherwise, is accepted when renewal accepts the identity it proves
// (returns nil). Azure's Instance Metadata Service caches a VM's token for
// most of its 24 hours and hands the same token to every request, so an
// agent renewing its onboarding token re-presents the token it onboarded
// with; renewal decides whether the request proves it comes from the agent
// that first used it (its onboarding token and session). renewal is asked
// only about a replayed token whose signature, issuer, audience, lifetime
// and claims all hold; a nil renewal accepts nothing twice. A token accepted
// this way stays recorded as used.
func (v *Verifier) VerifyRenewal(ctx context.Context, token string, renewal func(*identity.Identity) error) (*identity.Identity, error) {
	return v.VerifyGated(ctx, token, renewal, nil)
}

// VerifyGated is VerifyRenewal with the VM check: when the verifier has
// one, gate (when not nil) is asked about the token's identity before
// Resource Manager is, so that a VM no policy could admit costs no call
// (the calls are rate limited for every caller), and the VM is then
// confirmed. Both run before the token is recorded as used: a token refused
// by them, or whose check could not be made, is not used up.
func (v *Verifier) VerifyGated(ctx context.Context, token string, renewal func(*identity.Identity) error, gate Gate) (*identity.Identity, error) {
	id, err := v.verifyToken(ctx, token)
	if err != nil {
		return nil, err
	}
	if v.vms != nil {
		if gate != nil {
			claimed := *id.Azure
			if err := gate(ctx, &identity.Identity{Method: id.Method, Azure: &claimed}); err != nil {
				return nil, err
			}
		}
		if err := v.confirm(ctx, id.Azure); err != nil {
			return nil, err
		}
	}
	fresh, err := v.reserve(ctx, token, id.Azure)
	switch {
	case err != nil:
		return nil, err
	case fresh:
		return id, nil
	}
	replayed := fmt.Sprintf("managed identity token of VM %s (resource group %s, subscription %s) was already used: every onboarding needs a token the endpoint has not seen",
		id.Azure.VMName, id.Azure.ResourceGroup, id.Azure.SubscriptionID)
	if renewal == nil {
		return nil, identity.Refuse(identity.ReasonReplayed, "%s", replayed)
	}
	if err := renewal(id); err != nil {
		return nil, identity.RefuseWrap(identity.ReasonReplayed, err, "%s, and it is not this VM's renewal", replayed)
	}
	return id, nil
}

// confirm asks Resource Manager about the VM of az and fills in what it
// confirms.
func (v *Verifier) confirm(ctx context.Context, az *identity.AzureIdentity) error {
	rid := VMResourceID{SubscriptionID: az.SubscriptionID, ResourceGroup: az.ResourceGroup, Name: az.VMName}
	vm, err := v.vms.Describe(ctx, rid)
	switch {
	case errors.Is(err, ErrVMNotFound):
		return identity.RefuseWrap(identity.ReasonVMNotFound, err, "Azure Resource Manager does not know VM %s", rid)
	case errors.Is(err, ErrNICNotFound):
		return identity.RefuseWrap(identity.ReasonVMMismatch, err, "Azure Resource Manager reports VM %s without a primary network interface address", rid)
	case err != nil:
		return identity.RefuseWrap(identity.ReasonVMCheckUnavailable, err, "ask Azure Resource Manager about VM %s", rid)
	case vm.ProvisioningState != "Succeeded":
		return identity.Refuse(identity.ReasonVMNotFound, "Azure Resource Manager reports VM %s in provisioning state %q, not Succeeded", rid, clip(vm.ProvisioningState))
	case vm.PrincipalID != az.PrincipalID:
		return identity.Refuse(identity.ReasonVMMismatch, "Azure Resource Manager reports VM %s with system-assigned identity %q, the token is of principal %s (the VM was created again under its name, or has no system-assigned identity)",
			rid, vm.PrincipalID, az.PrincipalID)
	}
	az.Location, az.VMID, az.Address, az.VMConfirmed = vm.Location, vm.VMID, vm.Address, true
	return nil
}

// verifyToken checks everything of token but whether it was used.
func (v *Verifier) verifyToken(ctx context.Context, token string) (*identity.Identity, error) {
	id, err := v.jwt.Verify(ctx, token)
	if err != nil {
		return nil, err
	}
	tenant, ok := v.tenantOf[id.JWT.Issuer]
	if !ok {
		// The jwt verifier accepts only the configured issuers.
		return nil, identity.Refuse(identity.ReasonUnknownIssuer, "token issuer %q is not an issuer of an allowed tenant", clip(id.JWT.Issuer))
	}
	az, err := parseIdentity(tenant, id.JWT.Attributes)
	if err != nil {
		return nil, err
	}
	az.Expiry = id.JWT.Expiry.UTC()
	return &identity.Identity{Method: identity.MethodAzureManagedIdentityToken, Azure: az}, nil
}

// reserve records token as used, here and in the shared record, and says
// whether it was not used before. It runs last, once everything else holds:
// a refused token is not used up.
func (v *Verifier) reserve(ctx context.Context, token string, az *identity.AzureIdentity) (bool, error) {
	fresh, err := v.jwt.ReserveToken(ctx, "azure", token, az.Expiry)
	if err != nil {
		return false, fmt.Errorf("check the managed identity token of VM %s against the ones already used: %w", az.VMName, err)
	}
	return fresh, nil
}
