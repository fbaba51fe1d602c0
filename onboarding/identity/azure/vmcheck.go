package azure

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/embark-mesh/embark/onboarding/identity/apicheck"
)

// API versions of the Resource Manager calls.
const (
	VMAPIVersion  = "2024-07-01"
	NICAPIVersion = "2024-05-01"
)

// Errors of Checker.Describe. ErrVMNotFound and ErrNICNotFound are
// refusals; the others say the check could not be made now.
var (
	ErrVMNotFound   = errors.New("the virtual machine is unknown to Azure Resource Manager")
	ErrNICNotFound  = errors.New("the VM's primary network interface is unknown to Azure Resource Manager")
	ErrRateLimited  = errors.New("the VM checks of Azure Resource Manager are over their rate limit")
	ErrUnavailable  = errors.New("the VM check could not ask Azure Resource Manager")
	errNoPrimaryNIC = errors.New("the virtual machine has no primary network interface")
)

// VMDescription is what Resource Manager reports of a VM and its primary
// network interface.
type VMDescription struct {
	ARMVM
	// Address is the private IPv4 address of the primary IP configuration
	// of the primary network interface.
	Address string
}

// Defaults of CheckerOptions.
const (
	DefaultARMEndpoint = "https://management.azure.com"
)

// CheckerOptions configures a Checker. Every field documents its default.
type CheckerOptions struct {
	// Token is the endpoint's own token for Resource Manager. Required.
	Token TokenSource
	// ARMEndpoint replaces Resource Manager's URL (tests, sovereign
	// clouds). Default DefaultARMEndpoint.
	ARMEndpoint string
	// HTTPClient. Default: a client that follows no redirect.
	HTTPClient *http.Client
	// Options bound the Resource Manager calls (a VM costs two: the VM and
	// its network interface) and say how long a VM's description is reused
	// (a VM deleted since is seen after at most CacheTTL, default 30s).
	apicheck.Options
}

// Checker describes VMs with Azure Resource Manager, rate limited and
// cached. It is safe for concurrent use.
type Checker struct {
	opts  CheckerOptions
	calls *apicheck.Calls
	vms   *apicheck.Cache[VMResourceID, VMDescription]
}

// NewChecker returns a Checker.
func NewChecker(opts CheckerOptions) (*Checker, error) {
	if opts.Token == nil {
		return nil, errors.New("azure VM check: a token source is required")
	}
	if opts.ARMEndpoint == "" {
		opts.ARMEndpoint = DefaultARMEndpoint
	}
	opts.ARMEndpoint = strings.TrimSuffix(opts.ARMEndpoint, "/")
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	opts.SetDefaults(apicheck.DefaultCacheTTL)
	return &Checker{opts: opts, calls: opts.Calls(ErrRateLimited), vms: apicheck.NewCache[VMResourceID, VMDescription](0, opts.Clock)}, nil
}

// Describe returns what Resource Manager reports of the VM id and its
// primary network interface.
func (c *Checker) Describe(ctx context.Context, id VMResourceID) (*VMDescription, error) {
	if vm, ok := c.vms.Get(id); ok {
		return &vm, nil
	}
	body, err := c.get(ctx, id.String(), VMAPIVersion)
	if err != nil {
		return nil, wrapNotFound(err, ErrVMNotFound, "virtual machine "+id.String())
	}
	vm, err := ParseARMVM(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	d := &VMDescription{ARMVM: *vm}
	if vm.PrimaryNIC == "" {
		return nil, fmt.Errorf("%w: %s: %w", ErrNICNotFound, id, errNoPrimaryNIC)
	}
	body, err = c.get(ctx, vm.PrimaryNIC, NICAPIVersion)
	if err != nil {
		return nil, wrapNotFound(err, ErrNICNotFound, "network interface "+vm.PrimaryNIC)
	}
	addr, err := ParseARMNICAddress(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrNICNotFound, vm.PrimaryNIC, err)
	}
	d.Address = addr.String()
	c.vms.Put(id, *d, c.opts.CacheTTL)
	return d, nil
}

// errNotFound is a 404 of Resource Manager.
var errNotFound = errors.New("HTTP 404")

// wrapNotFound makes a 404 the refusal notFound, anything else unavailable.
func wrapNotFound(err, notFound error, what string) error {
	if errors.Is(err, errNotFound) {
		return fmt.Errorf("%w: %s", notFound, what)
	}
	return err
}

// get GETs the resource path with api-version, with the endpoint's token,
// within the rate limit. A 404 is errNotFound; another failure is
// ErrUnavailable or ErrRateLimited.
func (c *Checker) get(ctx context.Context, path, apiVersion string) ([]byte, error) {
	ctx, cancel, err := c.calls.Start(ctx)
	if err != nil {
		return nil, err
	}
	defer cancel()
	tok, err := c.opts.Token.Token(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: the endpoint's own token: %w", ErrUnavailable, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.opts.ARMEndpoint+path+"?api-version="+apiVersion, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := c.opts.HTTPClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: GET %s: %w", ErrUnavailable, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxARMBody+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: GET %s: %w", ErrUnavailable, path, err)
	case resp.StatusCode == http.StatusNotFound:
		return nil, errNotFound
	case resp.StatusCode != http.StatusOK:
		c.opts.Logger.Warn("Azure Resource Manager refused the VM check", "path", path, "status", resp.StatusCode)
		return nil, fmt.Errorf("%w: GET %s: HTTP %d: %s", ErrUnavailable, path, resp.StatusCode, clip(string(body)))
	}
	return body, nil
}
