package endpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/token"
	"github.com/embark-mesh/embark/registry"
)

// SessionKeyMetadata is the request metadata that carries the agent's
// session key (RegisterResponse.session_key) on Register, RenewSidecarToken
// and Unregister, and on Authorize, whose onboarding token is then bound to
// the session.
const SessionKeyMetadata = "embark-session-key"

// SourceCheck configures how the endpoint checks a workload address against
// the source address of the connection that registers it.
type SourceCheck struct {
	// Enabled requires the workload address to equal the connection's source
	// address (the gRPC peer), unless the peer is in TrustedProxies. Enable
	// it when agents reach the endpoint without source NAT (a Service with
	// externalTrafficPolicy: Local, a load balancer that preserves client
	// addresses, or a direct route). Default false: behind a proxy or SNAT
	// the peer is not the workload, and only the identity proves the
	// address.
	Enabled bool
	// TrustedProxies are the peers whose connections are not checked
	// (the addresses of proxies in front of the endpoint). Default: none.
	TrustedProxies []netip.Prefix
}

// normalizeAddresses rewrites every reported address to its canonical form
// and refuses addresses that cannot be a workload's (see
// registry.ParseWorkloadAddress) or that lie in a cluster Service range, with
// InvalidArgument naming the field.
func (s *Server) normalizeAddresses(reg *runtimev1alpha1.Registration) error {
	for i := range reg.Host.Addresses {
		a := &reg.Host.Addresses[i]
		ip, err := registry.ParseWorkloadAddress(a.IP, s.opts.AllowLoopbackAddresses)
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "addresses[%d].ip %q: %v", i, clip(a.IP), err)
		}
		for _, p := range s.opts.ServiceCIDRs {
			if p.Contains(ip) {
				return status.Errorf(codes.InvalidArgument, "addresses[%d].ip %s: in the cluster Service range %s, not a workload address", i, ip, p)
			}
		}
		a.IP = ip.String()
	}
	return nil
}

// checkSource refuses addr when the source check is enabled and the
// connection comes from another address that is not a trusted proxy.
func (s *Server) checkSource(ctx context.Context, addr netip.Addr) error {
	if !s.opts.Source.Enabled {
		return nil
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return status.Error(codes.PermissionDenied, "addresses: the connection's source address is unknown; it cannot confirm the workload address")
	}
	src, ok := peerAddr(p.Addr)
	if !ok {
		return status.Errorf(codes.PermissionDenied, "addresses: the connection's source %s is not an IP address; it cannot confirm the workload address", p.Addr)
	}
	for _, tp := range s.opts.Source.TrustedProxies {
		if tp.Contains(src) {
			return nil
		}
	}
	if src != addr {
		s.opts.Metrics.denied("register", "SourceMismatch")
		return status.Errorf(codes.PermissionDenied, "addresses: workload address %s is not the connection's source address %s", addr, src)
	}
	return nil
}

func peerAddr(a net.Addr) (netip.Addr, bool) {
	if tcp, ok := a.(*net.TCPAddr); ok {
		ip, ok := netip.AddrFromSlice(tcp.IP)
		return ip.Unmap(), ok
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap(), true
}

// sessionKey returns the session key the request carries ("" when none).
func sessionKey(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(SessionKeyMetadata); len(v) == 1 && len(v[0]) <= 128 {
		return v[0]
	}
	return ""
}

// requestSessionHash is SessionHash of the request's session key, which the
// onboarding token Authorize issues is bound to; "" when the request
// carries none (the token is bound to no session).
func requestSessionHash(ctx context.Context) string {
	if key := sessionKey(ctx); key != "" {
		return registry.SessionHash(key)
	}
	return ""
}

// errSessionBinding: the request does not carry the session key its
// onboarding token is bound to.
var errSessionBinding = errors.New("the onboarding token is bound to another agent session")

// checkBinding refuses a request whose onboarding token is bound to an
// agent session (its cnf claim) unless it carries that session's key:
// a leaked onboarding token alone registers nothing.
func checkBinding(ctx context.Context, claims *token.Claims) error {
	if claims.SessionHash == "" {
		return nil
	}
	if key := sessionKey(ctx); key == "" || registry.SessionHash(key) != claims.SessionHash {
		return errSessionBinding
	}
	return nil
}

// newSessionKey returns a random session key.
func newSessionKey() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate session key: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}
