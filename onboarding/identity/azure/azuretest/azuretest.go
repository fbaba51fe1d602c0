// Package azuretest is a loopback Microsoft Entra ID for tests: a TLS
// server publishing each tenant's OpenID configuration and keys (like
// https://login.microsoftonline.com/<tenant>/discovery/v2.0/keys) with a
// key that signs managed identity tokens as Entra ID does, and an Azure
// Instance Metadata Service that issues them to a VM and reports its
// network.
package azuretest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity/jwt/jwttest"
)

// Microsoft serves the tenants' OpenID configurations and JWKS over TLS and
// signs tokens with its key.
type Microsoft struct{ *jwttest.Issuer }

// NewMicrosoft starts a key server with one fresh RSA key. Close it when
// done.
func NewMicrosoft() (*Microsoft, error) {
	i, err := jwttest.Start("azuretest", func(i *jwttest.Issuer) http.Handler { return http.HandlerFunc((&Microsoft{Issuer: i}).serve) })
	if err != nil {
		return nil, err
	}
	return &Microsoft{Issuer: i}, nil
}

// serve answers /<tenant>/discovery/v2.0/keys and
// /<tenant>/v2.0/.well-known/openid-configuration.
func (m *Microsoft) serve(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
	switch {
	case len(parts) == 4 && parts[1] == "discovery" && parts[2] == "v2.0" && parts[3] == "keys":
		m.ServeJWKS(w)
	case len(parts) == 4 && parts[1] == "v2.0" && parts[2] == ".well-known" && parts[3] == "openid-configuration":
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"issuer":                                "https://login.microsoftonline.com/" + parts[0] + "/v2.0",
			"jwks_uri":                              m.URL() + "/" + parts[0] + "/discovery/v2.0/keys",
			"id_token_signing_alg_values_supported": []string{"RS256"},
		})
	default:
		http.NotFound(w, r)
	}
}

// JWKSURL is the key endpoint's URL with the {tenant} placeholder, for
// azure.Config.JWKSURL.
func (m *Microsoft) JWKSURL() string { return m.URL() + "/{tenant}/discovery/v2.0/keys" }

// OpenIDConfigurationURL is tenant's OpenID configuration document.
func (m *Microsoft) OpenIDConfigurationURL(tenant string) string {
	return m.URL() + "/" + tenant + "/v2.0/.well-known/openid-configuration"
}

// VM is an Azure virtual machine with a system-assigned managed identity.
type VM struct {
	TenantID       string
	SubscriptionID string
	ResourceGroup  string
	Name           string
	// VMID is the VM's unique ID (IMDS compute/vmId).
	VMID string
	// PrincipalID is the object ID of its system-assigned identity.
	PrincipalID string
	Location    string
	// IP is the first network interface's private IPv4 address.
	IP string
}

// DefaultVM is VM ratings-1 of resource group embark-rg.
func DefaultVM() VM {
	return VM{
		TenantID: "72f988bf-86f1-41af-91ab-2d7cd011db47", SubscriptionID: "0b1f6471-1bf0-4dda-aec3-cb9272f09590",
		ResourceGroup: "Embark-RG", Name: "ratings-1", VMID: "13f56399-bd52-4150-9748-7190aae1ff21",
		PrincipalID: "9b5a7f2e-3c1d-4e8f-a6b2-0d4c8e1f7a93", Location: "westeurope", IP: "10.1.0.4",
	}
}

// ResourceID is the VM's resource ID as xms_mirid spells it.
func (vm VM) ResourceID() string {
	return fmt.Sprintf("/subscriptions/%s/resourcegroups/%s/providers/Microsoft.Compute/virtualMachines/%s", vm.SubscriptionID, vm.ResourceGroup, vm.Name)
}

// Claims are the claims of a v1 managed identity access token for
// audience issued at iat, valid for 24 hours, as Entra ID writes them.
func (vm VM) Claims(audience string, iat time.Time) map[string]any {
	return map[string]any{
		"aud": audience, "iss": "https://sts.windows.net/" + vm.TenantID + "/",
		"iat": iat.Unix(), "nbf": iat.Unix(), "exp": iat.Add(24 * time.Hour).Unix(),
		"aio": "E2ZgYDh4cHn/", "appid": "5a2b1c3d-0000-4000-8000-000000000001", "appidacr": "2",
		"idp": "https://sts.windows.net/" + vm.TenantID + "/", "idtyp": "app",
		"oid": vm.PrincipalID, "sub": vm.PrincipalID, "tid": vm.TenantID,
		"rh": "0.AAAA", "uti": "dHVp", "ver": "1.0", "xms_mirid": vm.ResourceID(),
	}
}

// Token is a token Entra ID issues to vm for audience at iat.
func (m *Microsoft) Token(vm VM, audience string, iat time.Time) (string, error) {
	return m.Sign(vm.Claims(audience, iat))
}

// IMDS is a VM's Instance Metadata Service: it answers
// /metadata/identity/oauth2/token (with Metadata: true, an api-version and
// a resource) with a token Microsoft signs, /metadata/instance/network with
// the VM's interface and /metadata/instance/compute/location in text, like
// Azure's.
type IMDS struct {
	srv       *httptest.Server
	microsoft *Microsoft
	vm        VM
	now       func() time.Time
	mu        sync.Mutex
	issued    int
	served    int
	// cached, when not nil, holds the token last issued per resource
	// (NewCachingIMDS).
	cached map[string]cachedToken
}

// cachedToken is a token answer a caching IMDS hands out again.
type cachedToken struct {
	iat time.Time
	tok string
}

// CacheRefreshBefore is how long before its expiry a caching IMDS
// (NewCachingIMDS) stops handing out a cached token and issues a new one.
const CacheRefreshBefore = 5 * time.Minute

// NewIMDS starts the metadata service of vm, issuing a new token (its own
// uti) for every request. Close it when done.
func NewIMDS(m *Microsoft, vm VM) *IMDS {
	s := &IMDS{microsoft: m, vm: vm, now: time.Now}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// NewCachingIMDS starts the metadata service of vm that caches tokens as
// Azure's managed identity subsystem does: every request for a resource gets
// the same token until it is within CacheRefreshBefore of its expiry
// (24 hours after issue). Close it when done.
func NewCachingIMDS(m *Microsoft, vm VM) *IMDS {
	s := &IMDS{microsoft: m, vm: vm, now: time.Now, cached: map[string]cachedToken{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// URL is the service's base URL (in place of http://169.254.169.254).
func (s *IMDS) URL() string { return s.srv.URL }

// Issued is how many tokens the service issued.
func (s *IMDS) Issued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.issued
}

// SetClock sets the service's clock (default time.Now), which dates the
// tokens it issues and says when a cached one is near expiry.
func (s *IMDS) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = now
}

// Served is how many token requests the service answered (with a new or a
// cached token).
func (s *IMDS) Served() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.served
}

// Close stops the server.
func (s *IMDS) Close() { s.srv.Close() }

func (s *IMDS) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	if r.Header.Get("Metadata") != "true" || r.Header.Get("X-Forwarded-For") != "" {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":"Bad request. Required metadata header not specified"}`))
		return
	}
	if r.URL.Query().Get("api-version") == "" {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":"Bad request. api-version was not specified in the request"}`))
		return
	}
	switch r.URL.Path {
	case "/metadata/identity/oauth2/token":
		s.serveToken(w, r)
	case "/metadata/instance/network":
		_ = json.NewEncoder(w).Encode(map[string]any{"interface": []any{map[string]any{
			"ipv4": map[string]any{
				"ipAddress": []any{map[string]any{"privateIpAddress": s.vm.IP, "publicIpAddress": ""}},
				"subnet":    []any{map[string]any{"address": "10.1.0.0", "prefix": "24"}},
			},
			"ipv6":       map[string]any{"ipAddress": []any{}},
			"macAddress": "000D3A2B4C5D",
		}}})
	case "/metadata/instance/compute/location":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(s.vm.Location))
	default:
		http.NotFound(w, r)
	}
}

func (s *IMDS) serveToken(w http.ResponseWriter, r *http.Request) {
	resource := r.URL.Query().Get("resource")
	if resource == "" {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":"invalid_request","error_description":"Required query variable 'resource' is missing"}`))
		return
	}
	iat, left, tok, err := s.token(resource)
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]string{
		"access_token": tok, "client_id": "5a2b1c3d-0000-4000-8000-000000000001",
		"expires_in": fmt.Sprint(int(left.Seconds())), "expires_on": fmt.Sprint(iat.Add(24 * time.Hour).Unix()), "ext_expires_in": fmt.Sprint(int(left.Seconds())),
		"not_before": fmt.Sprint(iat.Unix()), "resource": resource, "token_type": "Bearer",
	})
}

// token returns the token for resource, when it was issued and how long it
// has left: the cached one if the service caches and it is not near
// expiry, else a new one.
func (s *IMDS) token(resource string) (iat time.Time, left time.Duration, tok string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.served++
	if c, ok := s.cached[resource]; ok && now.Before(c.iat.Add(24*time.Hour-CacheRefreshBefore)) {
		return c.iat, c.iat.Add(24 * time.Hour).Sub(now), c.tok, nil
	}
	claims := s.vm.Claims(resource, now)
	// RS256 signatures are deterministic, so two tokens of one second would
	// be identical; Entra ID gives every token its own uti, and so does
	// this fake, so that tokens issued apart are never the same.
	s.issued++
	claims["uti"] = fmt.Sprintf("azuretest-%d", s.issued)
	if tok, err = s.microsoft.Sign(claims); err != nil {
		return now, 0, "", err
	}
	if s.cached != nil {
		s.cached[resource] = cachedToken{iat: now, tok: tok}
	}
	return now, 24 * time.Hour, tok, nil
}
