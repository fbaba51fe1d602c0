package platform

import (
	"context"
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

// DefaultGCEMetadataEndpoint is the Compute Engine metadata server.
const DefaultGCEMetadataEndpoint = "http://metadata.google.internal"

// gceTimeout bounds one request to the metadata server.
const gceTimeout = 10 * time.Second

// maxGCEAnswer bounds what is read of one metadata answer (a token is ~1 KiB).
const maxGCEAnswer = 16 << 10

// GCE is the Compute Engine platform: the instance identity token of the
// default service account, for the onboarding endpoint's audience.
type GCE struct {
	endpoint string
	audience string
	client   *http.Client
	log      *slog.Logger
}

// NewGCE returns the Compute Engine platform; audience is the token's aud
// (the onboarding endpoint).
func NewGCE(cfg config.GCEPlatform, audience string, log *slog.Logger) *GCE {
	ep := cfg.MetadataEndpoint
	if ep == "" {
		ep = DefaultGCEMetadataEndpoint
	}
	// The metadata server is never reached through a proxy, and a redirect
	// is not followed: an answer must come from the metadata server itself.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	client := &http.Client{Timeout: gceTimeout, Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &GCE{endpoint: strings.TrimSuffix(ep, "/"), audience: audience, client: client, log: log}
}

// Name implements Platform.
func (*GCE) Name() string { return config.PlatformGCE }

// probe asks the metadata server for the instance's zone.
func (g *GCE) probe(ctx context.Context) (string, error) {
	return g.get(ctx, "/computeMetadata/v1/instance/zone", nil)
}

// Credential implements Platform: a fresh instance identity token with the
// google.compute_engine claims (format=full), and the first network
// interface's address as the host's VPC address.
func (g *GCE) Credential(ctx context.Context) (*Credential, error) {
	q := url.Values{"audience": {g.audience}, "format": {"full"}}
	tok, err := g.get(ctx, "/computeMetadata/v1/instance/service-accounts/default/identity", q)
	if err != nil {
		return nil, fmt.Errorf("gce: instance identity token: %w", err)
	}
	out := &Credential{GCE: &onboardingv1alpha1.GCECredential{Token: strings.TrimSpace(tok)}}
	ip, err := g.get(ctx, "/computeMetadata/v1/instance/network-interfaces/0/ip", nil)
	if err != nil {
		g.log.Debug("gce: no network interface address from the metadata server", "error", err.Error())
		return out, nil
	}
	if a, err := netip.ParseAddr(strings.TrimSpace(ip)); err == nil {
		out.Address = &Address{IP: a.String(), Type: "VPC"}
	}
	return out, nil
}

// get reads path from the metadata server with the Metadata-Flavor header
// it requires, and checks the answer carries it too.
func (g *GCE) get(ctx context.Context, path string, q url.Values) (string, error) {
	u := g.endpoint + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Metadata-Flavor", "Google")
	resp, err := g.client.Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxGCEAnswer))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("metadata server %s answered %s: %s", path, resp.Status, strings.TrimSpace(string(body[:min(len(body), 200)])))
	}
	if resp.Header.Get("Metadata-Flavor") != "Google" {
		return "", fmt.Errorf("%s answered without Metadata-Flavor: Google: not a Compute Engine metadata server", g.endpoint)
	}
	if len(body) == 0 {
		return "", errors.New("empty answer")
	}
	return string(body), nil
}
