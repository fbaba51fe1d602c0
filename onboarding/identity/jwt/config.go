package jwt

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity"
)

// IssuerConfig is one trusted OIDC issuer.
type IssuerConfig struct {
	// Issuer is the exact iss of its tokens, e.g. https://idp.example.com.
	// Required, unique.
	Issuer string `json:"issuer"`
	// ShortName names the issuer in workload names
	// (jwt-<shortName>-<subject>). Required, unique, a DNS-1123 label.
	ShortName string `json:"shortName"`
	// Audiences: a token's aud must contain at least one of them. Required.
	Audiences []string `json:"audiences"`
	// JWKS is the issuer's JSON Web Key Set, inline. At most one of JWKS
	// and JWKSURL; with neither, the key set is found by OIDC discovery
	// (<Issuer>/.well-known/openid-configuration, its jwks_uri), and Issuer
	// must then be an https URL.
	JWKS json.RawMessage `json:"jwks,omitempty"`
	// JWKSURL is where the issuer's JSON Web Key Set is fetched from; it
	// must be https.
	JWKSURL string `json:"jwksUri,omitempty"`
	// CACertificates (PEM) are the roots that the issuer's discovery
	// document and JWKS URL are verified with. Default: the system roots.
	CACertificates []byte `json:"caCertificates,omitempty"`
	// MaxTokenLifetime refuses tokens whose lifetime (exp minus iat, else
	// nbf, else the time of verification) is longer. Zero: 1h
	// (DefaultMaxTokenLifetime).
	MaxTokenLifetime time.Duration `json:"maxTokenLifetime,omitempty"`
	// SubjectPrefix, when set, is required at the start of every token's
	// sub and removed from it: the rest is the workload's subject (policy
	// subjects, names). E.g. "system:serviceaccount:onprem:" makes a
	// Kubernetes service-account issuer's token for service account
	// vm-01.example.com prove subject vm-01.example.com.
	SubjectPrefix string `json:"subjectPrefix,omitempty"`
	// AllowTokensWithoutJTI accepts tokens without a jti claim, which
	// cannot be refused as replays. Default false: a token must carry a jti,
	// and each jti is accepted once within the token's lifetime.
	AllowTokensWithoutJTI bool `json:"allowTokensWithoutJTI,omitempty"`
	// Attributes maps an attribute name to the dotted path of the claim it
	// is read from, e.g. {"region": "custom.location.region"} reads
	// claims["custom"]["location"]["region"]. Optional.
	Attributes map[string]string `json:"attributes,omitempty"`
}

const maxShortNameLength = 63

func (c *IssuerConfig) validate() error {
	var errs []error
	if c.Issuer == "" {
		errs = append(errs, errors.New("issuer is required"))
	}
	switch {
	case c.ShortName == "":
		errs = append(errs, errors.New("shortName is required"))
	case identity.SanitizeDNSLabel(c.ShortName) != c.ShortName || len(c.ShortName) > maxShortNameLength:
		errs = append(errs, fmt.Errorf("shortName %q must be a DNS-1123 label ([a-z0-9-], no leading or trailing '-') of at most %d characters", c.ShortName, maxShortNameLength))
	}
	if len(c.Audiences) == 0 {
		errs = append(errs, errors.New("at least one audience is required"))
	}
	for _, a := range c.Audiences {
		if a == "" {
			errs = append(errs, errors.New("audiences must not be empty strings"))
		}
	}
	switch {
	case len(c.JWKS) > 0 && c.JWKSURL != "":
		errs = append(errs, errors.New("jwks and jwksUri are mutually exclusive"))
	case len(c.JWKS) == 0 && c.JWKSURL == "":
		// OIDC discovery from the issuer.
		if u, err := url.Parse(c.Issuer); c.Issuer != "" && (err != nil || u.Scheme != "https" || u.Host == "") {
			errs = append(errs, fmt.Errorf("issuer %q must be an https URL for OIDC discovery (or set jwks or jwksUri)", c.Issuer))
		}
	case c.JWKSURL != "":
		u, err := url.Parse(c.JWKSURL)
		if err != nil {
			errs = append(errs, fmt.Errorf("jwksUri: %w", err))
		} else if u.Scheme != "https" || u.Host == "" {
			errs = append(errs, fmt.Errorf("jwksUri %q must be an https URL", c.JWKSURL))
		}
	}
	if c.MaxTokenLifetime < 0 {
		errs = append(errs, fmt.Errorf("maxTokenLifetime %s must not be negative", c.MaxTokenLifetime))
	}
	if len(c.CACertificates) > 0 && !x509.NewCertPool().AppendCertsFromPEM(c.CACertificates) {
		errs = append(errs, errors.New("caCertificates holds no PEM certificate"))
	}
	for name, path := range c.Attributes {
		if name == "" {
			errs = append(errs, errors.New("attribute names must not be empty"))
		}
		if path == "" || strings.HasPrefix(path, ".") || strings.HasSuffix(path, ".") || strings.Contains(path, "..") {
			errs = append(errs, fmt.Errorf("attribute %q: path %q is not a dotted claim path like a.b.c", name, path))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("issuer %q: %w", c.Issuer, err)
	}
	return nil
}
