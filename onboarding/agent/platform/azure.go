package platform

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/embark-mesh/embark/onboarding/agent/config"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
)

// DefaultAzureIMDSEndpoint is the Azure Instance Metadata Service.
const DefaultAzureIMDSEndpoint = "http://169.254.169.254"

const (
	// azureTimeout bounds one request to the Instance Metadata Service.
	azureTimeout = 10 * time.Second
	// maxAzureAnswer bounds what is read of one answer (a token response is
	// a few KiB).
	maxAzureAnswer = 64 << 10
	// maxAzureToken bounds the access token taken from an answer.
	maxAzureToken = 16 << 10
	// azureTokenAPIVersion and azureInstanceAPIVersion are the IMDS API
	// versions asked for.
	azureTokenAPIVersion    = "2018-02-01"
	azureInstanceAPIVersion = "2021-02-01"
)

// Azure is the Azure VM platform: the access token of the VM's
// system-assigned managed identity for the onboarding endpoint's resource.
type Azure struct {
	endpoint string
	resource string
	client   *http.Client
	log      *slog.Logger
}

// NewAzure returns the Azure platform; the token is requested for
// cfg.Resource, else audience (the onboarding endpoint).
func NewAzure(cfg config.AzurePlatform, audience string, log *slog.Logger) *Azure {
	ep := cfg.IMDSEndpoint
	if ep == "" {
		ep = DefaultAzureIMDSEndpoint
	}
	resource := cfg.Resource
	if resource == "" {
		resource = audience
	}
	// IMDS is never reached through a proxy (it refuses requests carrying
	// X-Forwarded-For), and a redirect is not followed.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	client := &http.Client{Timeout: azureTimeout, Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &Azure{endpoint: strings.TrimSuffix(ep, "/"), resource: resource, client: client, log: log}
}

// Name implements Platform.
func (*Azure) Name() string { return config.PlatformAzure }

// probe asks IMDS for the VM's location.
func (a *Azure) probe(ctx context.Context) (string, error) {
	b, err := a.get(ctx, "/metadata/instance/compute/location", url.Values{"api-version": {azureInstanceAPIVersion}, "format": {"text"}})
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// Credential implements Platform: a managed identity access token for the
// endpoint's resource, and the first interface's private IPv4 address as
// the host's VPC address.
func (a *Azure) Credential(ctx context.Context) (*Credential, error) {
	b, err := a.get(ctx, "/metadata/identity/oauth2/token", url.Values{"api-version": {azureTokenAPIVersion}, "resource": {a.resource}})
	if err != nil {
		return nil, fmt.Errorf("azure: managed identity token: %w", err)
	}
	tok, err := parseAzureToken(b)
	if err != nil {
		return nil, fmt.Errorf("azure: managed identity token: %w", err)
	}
	out := &Credential{Azure: &onboardingv1alpha1.AzureCredential{Token: tok}}
	nb, err := a.get(ctx, "/metadata/instance/network", url.Values{"api-version": {azureInstanceAPIVersion}})
	if err == nil {
		var ip netip.Addr
		if ip, err = parseAzureNetwork(nb); err == nil {
			out.Address = &Address{IP: ip.String(), Type: "VPC"}
		}
	}
	if err != nil {
		a.log.Debug("azure: no private address from the Instance Metadata Service", "error", err.Error())
	}
	return out, nil
}

// parseAzureToken reads access_token from an IMDS token answer.
func parseAzureToken(b []byte) (string, error) {
	var resp struct {
		AccessToken string `json:"access_token"`
		TokenType   string `json:"token_type"`
	}
	if err := json.Unmarshal(b, &resp); err != nil {
		return "", fmt.Errorf("answer is not a token response: %w", err)
	}
	tok := strings.TrimSpace(resp.AccessToken)
	switch {
	case tok == "":
		return "", errors.New("answer has no access_token")
	case len(tok) > maxAzureToken:
		return "", fmt.Errorf("access_token is %d bytes long, at most %d", len(tok), maxAzureToken)
	case strings.Count(tok, ".") != 2:
		return "", errors.New("access_token is not a JWT")
	}
	return tok, nil
}

// parseAzureNetwork reads the first interface's first private IPv4 address
// from an IMDS /metadata/instance/network answer.
func parseAzureNetwork(b []byte) (netip.Addr, error) {
	var resp struct {
		Interface []struct {
			IPv4 struct {
				IPAddress []struct {
					PrivateIPAddress string `json:"privateIpAddress"`
				} `json:"ipAddress"`
			} `json:"ipv4"`
		} `json:"interface"`
	}
	if err := json.Unmarshal(b, &resp); err != nil {
		return netip.Addr{}, fmt.Errorf("network answer: %w", err)
	}
	if len(resp.Interface) == 0 || len(resp.Interface[0].IPv4.IPAddress) == 0 {
		return netip.Addr{}, errors.New("network answer lists no interface with an IPv4 address")
	}
	s := resp.Interface[0].IPv4.IPAddress[0].PrivateIPAddress
	ip, err := netip.ParseAddr(s)
	if err != nil || !ip.Is4() {
		return netip.Addr{}, fmt.Errorf("network answer: private address %q is not an IPv4 address", clipAnswer(s))
	}
	return ip, nil
}

// get reads path from IMDS with the Metadata: true header it requires.
func (a *Azure) get(ctx context.Context, path string, q url.Values) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.endpoint+path+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Metadata", "true")
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAzureAnswer))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("instance metadata service %s answered %s: %s", path, resp.Status, clipAnswer(strings.TrimSpace(string(body))))
	}
	if len(body) == 0 {
		return nil, errors.New("empty answer")
	}
	return body, nil
}

func clipAnswer(s string) string { return s[:min(len(s), 200)] }
