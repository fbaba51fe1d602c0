package gce

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/embark-mesh/embark/onboarding/identity/apicheck"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
)

// Errors of Checker.Describe. ErrInstanceNotFound is a refusal; the others
// say the check could not be made now.
var (
	ErrInstanceNotFound = errors.New("the Compute API does not know the instance")
	ErrRateLimited      = errors.New("instance checks of the Compute API over their rate limit")
	ErrUnavailable      = errors.New("the Compute API could not be asked")
)

// ComputeInstance is what the Compute API reports of an instance.
type ComputeInstance struct {
	// ID is the instance's numeric ID, Name its name, Status its status
	// (RUNNING, STOPPING, TERMINATED, ...).
	ID, Name, Status string
	// NetworkIP is the internal IPv4 address of the primary network
	// interface (nic0), canonical; "" when the instance has none.
	NetworkIP string
}

// Defaults of CheckerOptions.
const (
	// DefaultComputeEndpoint is the Compute API's base URL.
	DefaultComputeEndpoint = "https://compute.googleapis.com"
	// ComputeReadOnlyScope is the OAuth scope the checker's credentials are
	// asked for.
	ComputeReadOnlyScope = "https://www.googleapis.com/auth/compute.readonly"
	maxInstanceBytes     = 1 << 20
)

// CheckerOptions configures a Checker. Every field documents its default.
type CheckerOptions struct {
	// TokenSource gives the endpoint's Google access tokens (scope
	// ComputeReadOnlyScope). Required.
	TokenSource oauth2.TokenSource
	// Endpoint is the Compute API's base URL. Default
	// DefaultComputeEndpoint.
	Endpoint string
	// Transport carries the requests. Default http.DefaultTransport.
	Transport http.RoundTripper
	// Options bound the Compute API calls and say how long an instance's
	// description is reused (an instance stopped or deleted since is seen
	// after at most CacheTTL, default 30s).
	apicheck.Options
}

// Checker describes instances with the Compute API
// (compute.instances.get), rate limited and cached.
type Checker struct {
	opts   CheckerOptions
	base   *url.URL
	client *http.Client
	calls  *apicheck.Calls
	cache  *apicheck.Cache[string, ComputeInstance] // by project/zone/name
}

// NewChecker returns a Checker.
func NewChecker(opts CheckerOptions) (*Checker, error) {
	if opts.TokenSource == nil {
		return nil, errors.New("gce instance check: TokenSource is required")
	}
	if opts.Endpoint == "" {
		opts.Endpoint = DefaultComputeEndpoint
	}
	base, err := url.Parse(strings.TrimSuffix(opts.Endpoint, "/"))
	if err != nil || (base.Scheme != "https" && base.Scheme != "http") || base.Host == "" {
		return nil, fmt.Errorf("gce instance check: endpoint %q is not an http(s) URL", opts.Endpoint)
	}
	setDefaults(&opts)
	client := &http.Client{
		Transport: &oauth2.Transport{Source: oauth2.ReuseTokenSource(nil, opts.TokenSource), Base: opts.Transport},
		// The API answers directly; a redirect would send the token elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return &Checker{opts: opts, base: base, client: client, calls: opts.Calls(ErrRateLimited), cache: apicheck.NewCache[string, ComputeInstance](0, opts.Clock)}, nil
}

func setDefaults(o *CheckerOptions) {
	if o.Transport == nil {
		o.Transport = http.DefaultTransport
	}
	o.SetDefaults(apicheck.DefaultCacheTTL)
}

// DefaultTokenSource is the endpoint's Application Default Credentials
// (GKE workload identity, the node's service account,
// GOOGLE_APPLICATION_CREDENTIALS), for ComputeReadOnlyScope. ctx is kept
// for the token requests: it must live as long as the checker.
func DefaultTokenSource(ctx context.Context) (oauth2.TokenSource, error) {
	ts, err := google.DefaultTokenSource(ctx, ComputeReadOnlyScope)
	if err != nil {
		return nil, fmt.Errorf("find Google application default credentials: %w", err)
	}
	return ts, nil
}

// CredentialsFromServiceAccountKey is the token source of a service
// account key file (JSON), for ComputeReadOnlyScope. Only service account
// keys are accepted: other credential types in a file can make the token
// requests go anywhere they name. ctx is kept for the token requests.
func CredentialsFromServiceAccountKey(ctx context.Context, key []byte) (oauth2.TokenSource, error) {
	c, err := google.CredentialsFromJSONWithType(ctx, key, google.ServiceAccount, ComputeReadOnlyScope)
	if err != nil {
		return nil, fmt.Errorf("read the service account key: %w", err)
	}
	return c.TokenSource, nil
}

// Describe returns what the Compute API reports of instance name in
// project's zone.
func (c *Checker) Describe(ctx context.Context, project, zone, name string) (*ComputeInstance, error) {
	key := project + "/" + zone + "/" + name
	if in, ok := c.cache.Get(key); ok {
		return &in, nil
	}
	ctx, cancel, err := c.calls.Start(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	in, err := c.get(ctx, project, zone, name)
	if err != nil {
		return nil, err
	}
	c.cache.Put(key, *in, c.opts.CacheTTL)
	return in, nil
}

// get asks GET {endpoint}/compute/v1/projects/{project}/zones/{zone}/instances/{name}.
func (c *Checker) get(ctx context.Context, project, zone, name string) (*ComputeInstance, error) {
	u := c.base.JoinPath("compute", "v1", "projects", project, "zones", zone, "instances", name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("%w: build request: %w", ErrUnavailable, err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: compute.instances.get %s: %w", ErrUnavailable, u.Path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxInstanceBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: compute.instances.get %s: read answer: %w", ErrUnavailable, u.Path, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, fmt.Errorf("%w: %s in project %s, zone %s", ErrInstanceNotFound, name, project, zone)
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		c.opts.Logger.Warn("the Compute API refused an instance check", "path", u.Path, "status", resp.StatusCode,
			"hint", "the endpoint's Google service account needs compute.instances.get on the instance's project")
		return nil, fmt.Errorf("%w: compute.instances.get %s answered %d: %s", ErrUnavailable, u.Path, resp.StatusCode, clip(string(body)))
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("%w: compute.instances.get %s answered %d: %s", ErrUnavailable, u.Path, resp.StatusCode, clip(string(body)))
	case len(body) > maxInstanceBytes:
		return nil, fmt.Errorf("%w: compute.instances.get %s answered more than %d bytes", ErrUnavailable, u.Path, maxInstanceBytes)
	}
	in, err := ParseInstance(body)
	if err != nil {
		return nil, fmt.Errorf("%w: compute.instances.get %s: %w", ErrUnavailable, u.Path, err)
	}
	if in.Name != name {
		return nil, fmt.Errorf("%w: compute.instances.get %s answered instance %q", ErrUnavailable, u.Path, clip(in.Name))
	}
	return in, nil
}

// instanceJSON is the part of the Compute API's Instance resource the check
// reads.
type instanceJSON struct {
	ID                json.RawMessage `json:"id"`
	Name              string          `json:"name"`
	Status            string          `json:"status"`
	NetworkInterfaces []struct {
		Name      string `json:"name"`
		NetworkIP string `json:"networkIP"`
	} `json:"networkInterfaces"`
}

// ParseInstance reads a Compute API Instance resource: its id (a decimal
// uint64, as a JSON string or number), name, status and the networkIP of
// its primary interface (the one named nic0, else the first listed), which
// must be an IPv4 address when present.
func ParseInstance(body []byte) (*ComputeInstance, error) {
	var raw instanceJSON
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, fmt.Errorf("instance resource: %w", err)
	}
	id := strings.Trim(string(raw.ID), `"`)
	if !instanceIDRE.MatchString(id) {
		return nil, fmt.Errorf("instance resource: id %q is not a numeric ID", clip(string(raw.ID)))
	}
	if !instanceNameRE.MatchString(raw.Name) {
		return nil, fmt.Errorf("instance resource: name %q is not an instance name", clip(raw.Name))
	}
	if raw.Status == "" || len(raw.Status) > 32 {
		return nil, fmt.Errorf("instance resource: status %q is not a status", clip(raw.Status))
	}
	in := &ComputeInstance{ID: id, Name: raw.Name, Status: raw.Status}
	if len(raw.NetworkInterfaces) == 0 {
		return in, nil
	}
	primary := raw.NetworkInterfaces[0]
	for _, n := range raw.NetworkInterfaces {
		if n.Name == "nic0" {
			primary = n
			break
		}
	}
	if primary.NetworkIP == "" {
		return in, nil
	}
	ip, err := netip.ParseAddr(primary.NetworkIP)
	if err != nil || !ip.Is4() {
		return nil, fmt.Errorf("instance resource: networkInterfaces %s networkIP %q is not an IPv4 address", clip(primary.Name), clip(primary.NetworkIP))
	}
	in.NetworkIP = ip.String()
	return in, nil
}
