package azure

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	// ARMResource is the resource (audience) of the endpoint's own tokens
	// for Azure Resource Manager.
	ARMResource = "https://management.azure.com/"
	// DefaultIMDSEndpoint is where the endpoint's own managed identity gets
	// its tokens on an Azure VM or AKS node.
	DefaultIMDSEndpoint = "http://169.254.169.254"
	// DefaultAuthorityHost is Entra ID's, for AKS workload identity.
	DefaultAuthorityHost = "https://login.microsoftonline.com/"
	// tokenRefreshBefore is how long before its expiry a cached token is
	// replaced.
	tokenRefreshBefore = 5 * time.Minute
	maxTokenAnswer     = 1 << 16
)

// TokenSource returns the endpoint's own bearer token for Azure Resource
// Manager.
type TokenSource interface {
	Token(ctx context.Context) (string, error)
}

// fetchFunc gets a new token and its lifetime.
type fetchFunc func(ctx context.Context) (string, time.Duration, error)

// cachingSource caches a token until tokenRefreshBefore its expiry.
type cachingSource struct {
	fetch fetchFunc
	now   func() time.Time

	mu      sync.Mutex
	token   string
	expires time.Time
}

// Token returns the cached token, or a new one near its expiry.
func (c *cachingSource) Token(ctx context.Context) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.token != "" && c.now().Before(c.expires.Add(-tokenRefreshBefore)) {
		return c.token, nil
	}
	tok, life, err := c.fetch(ctx)
	if err != nil {
		return "", err
	}
	c.token, c.expires = tok, c.now().Add(life)
	return tok, nil
}

// TokenSourceOptions configures NewTokenSource.
type TokenSourceOptions struct {
	// Getenv reads the environment. Default os.Getenv.
	Getenv func(string) string
	// IMDSEndpoint replaces DefaultIMDSEndpoint (tests).
	IMDSEndpoint string
	// HTTPClient. Default: a client with a 10s timeout that follows no
	// redirect and, for IMDS, uses no proxy.
	HTTPClient *http.Client
	// Clock. Default time.Now.
	Clock func() time.Time
}

// NewTokenSource returns the endpoint's token source for Azure Resource
// Manager: AKS workload identity when AZURE_FEDERATED_TOKEN_FILE is set
// (with AZURE_CLIENT_ID, AZURE_TENANT_ID and optionally
// AZURE_AUTHORITY_HOST, as the AKS webhook sets them), else the managed
// identity of the VM or node through IMDS (AZURE_CLIENT_ID, when set,
// picks a user-assigned identity). Tokens are cached until five minutes
// before they expire.
func NewTokenSource(o TokenSourceOptions) (TokenSource, error) {
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.IMDSEndpoint == "" {
		o.IMDSEndpoint = DefaultIMDSEndpoint
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	clientID, file := o.Getenv("AZURE_CLIENT_ID"), o.Getenv("AZURE_FEDERATED_TOKEN_FILE")
	if o.HTTPClient == nil {
		o.HTTPClient = defaultTokenClient(file == "")
	}
	if file != "" {
		tenant, authority := o.Getenv("AZURE_TENANT_ID"), o.Getenv("AZURE_AUTHORITY_HOST")
		if !guidRE.MatchString(tenant) || clientID == "" {
			return nil, errors.New("workload identity (AZURE_FEDERATED_TOKEN_FILE) needs AZURE_TENANT_ID (a GUID) and AZURE_CLIENT_ID")
		}
		if authority == "" {
			authority = DefaultAuthorityHost
		}
		tokenURL := strings.TrimSuffix(authority, "/") + "/" + tenant + "/oauth2/v2.0/token"
		return &cachingSource{now: o.Clock, fetch: func(ctx context.Context) (string, time.Duration, error) {
			return fetchFederated(ctx, o.HTTPClient, tokenURL, clientID, file)
		}}, nil
	}
	q := url.Values{"api-version": {"2018-02-01"}, "resource": {ARMResource}}
	if clientID != "" {
		q.Set("client_id", clientID)
	}
	tokenURL := strings.TrimSuffix(o.IMDSEndpoint, "/") + "/metadata/identity/oauth2/token?" + q.Encode()
	return &cachingSource{now: o.Clock, fetch: func(ctx context.Context) (string, time.Duration, error) {
		return fetchIMDS(ctx, o.HTTPClient, tokenURL)
	}}, nil
}

// defaultTokenClient is a client with a 10s timeout that follows no
// redirect; for IMDS it uses no proxy (IMDS answers only direct requests).
func defaultTokenClient(imds bool) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if imds {
		tr.Proxy = nil
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// fetchIMDS asks the Instance Metadata Service for a token.
func fetchIMDS(ctx context.Context, hc *http.Client, tokenURL string) (string, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, tokenURL, nil)
	if err != nil {
		return "", 0, fmt.Errorf("managed identity token: %w", err)
	}
	req.Header.Set("Metadata", "true")
	return doToken(hc, req, "managed identity token from IMDS")
}

// fetchFederated exchanges the workload's federated token (the projected
// service account token) for an Entra ID token for Resource Manager.
func fetchFederated(ctx context.Context, hc *http.Client, tokenURL, clientID, file string) (string, time.Duration, error) {
	assertion, err := os.ReadFile(file)
	if err != nil {
		return "", 0, fmt.Errorf("workload identity: read AZURE_FEDERATED_TOKEN_FILE: %w", err)
	}
	form := url.Values{
		"grant_type":            {"client_credentials"},
		"client_id":             {clientID},
		"scope":                 {ARMResource + ".default"},
		"client_assertion_type": {"urn:ietf:params:oauth:client-assertion-type:jwt-bearer"},
		"client_assertion":      {strings.TrimSpace(string(assertion))},
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tokenURL, strings.NewReader(form.Encode()))
	if err != nil {
		return "", 0, fmt.Errorf("workload identity token: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return doToken(hc, req, "workload identity token from Entra ID")
}

// doToken sends req and reads an OAuth token answer.
func doToken(hc *http.Client, req *http.Request, what string) (string, time.Duration, error) {
	resp, err := hc.Do(req)
	if err != nil {
		return "", 0, fmt.Errorf("%s: %w", what, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenAnswer))
	if err != nil {
		return "", 0, fmt.Errorf("%s: %w", what, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", 0, fmt.Errorf("%s: HTTP %d: %s", what, resp.StatusCode, clip(string(body)))
	}
	tok, life, err := ParseTokenAnswer(body)
	if err != nil {
		return "", 0, fmt.Errorf("%s: %w", what, err)
	}
	return tok, life, nil
}

// ParseTokenAnswer reads access_token and expires_in (a number, or a
// string of one, as IMDS writes it) from an OAuth token answer.
func ParseTokenAnswer(body []byte) (string, time.Duration, error) {
	var doc struct {
		AccessToken string          `json:"access_token"`
		ExpiresIn   json.RawMessage `json:"expires_in"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return "", 0, fmt.Errorf("token answer: %w", err)
	}
	if doc.AccessToken == "" || len(doc.AccessToken) > maxTokenAnswer {
		return "", 0, errors.New("token answer has no access_token")
	}
	secs, err := strconv.ParseInt(strings.Trim(string(doc.ExpiresIn), `"`), 10, 64)
	if err != nil || secs <= 0 || secs > 7*24*3600 {
		return "", 0, fmt.Errorf("token answer's expires_in %q is not a number of seconds up to a week", clip(string(doc.ExpiresIn)))
	}
	return doc.AccessToken, time.Duration(secs) * time.Second, nil
}
