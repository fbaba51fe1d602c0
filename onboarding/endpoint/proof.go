package endpoint

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
)

// SessionKeyMetadata is the request metadata that carries the agent's
// session key (RegisterResponse.session_key) on Register, RenewSidecarToken
// and Unregister.
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

// proveAddress decides whether the workload address addr may be registered:
// it is proven when the platform credential proves it (an EC2 document's
// signed privateIp, for a VPC address); otherwise an OnboardingPolicy rule
// allowing the workload must list it in addressCIDRs. When the source check
// is enabled, addr must also be the connection's source. It returns whether
// addr is proven.
func (s *Server) proveAddress(ctx context.Context, ns, group string, id runtimev1alpha1.WorkloadIdentity, provenAddr string, addr netip.Addr, typ runtimev1alpha1.AddressType) (bool, error) {
	if err := s.checkSource(ctx, addr); err != nil {
		return false, err
	}
	if id.AWS != nil && typ == runtimev1alpha1.AddressTypeVPC && provenAddr != "" && provenAddr == addr.String() {
		return true, nil
	}
	ok, err := s.opts.Authorizer.AllowsAddress(ctx, ns, group, id, addr)
	if err != nil {
		return false, s.authzStatus(err, "register")
	}
	if !ok {
		s.opts.Metrics.denied("register", "AddressNotProven")
		what := "its identity proves no address (a JWT host)"
		if id.AWS != nil {
			what = fmt.Sprintf("its instance identity document proves only the VPC address %s", provenAddr)
		}
		return false, status.Errorf(codes.PermissionDenied,
			"addresses: workload address %s (%s) is not proven: %s, and no OnboardingPolicy rule allowing it in namespace %s lists it in addressCIDRs",
			addr, typ, what, ns)
	}
	return false, nil
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

// newSessionKey returns a random session key.
func newSessionKey() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate session key: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// sessionHash is what a registration stores of a session key.
func sessionHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// checkSession refuses a request whose session key does not match the
// registration's (registry.AnnotationSessionHash).
func checkSession(ctx context.Context, war *runtimev1alpha1.WorkloadAutoRegistration) error {
	want := war.Annotations[registry.AnnotationSessionHash]
	key := sessionKey(ctx)
	if want == "" || key == "" || sessionHash(key) != want {
		return status.Errorf(codes.PermissionDenied, "registration %s/%s is bound to another agent session (metadata %s missing or wrong): register again", war.Namespace, war.Name, SessionKeyMetadata)
	}
	return nil
}

// freshProof says whether the identity carries a proof that may take an
// existing registration over from another agent session: an STS proof of
// the instance's role session, or a JWT (short-lived, issued to the host).
// A bare instance identity document, which never expires and which anything
// on the instance can read, never does.
func freshProof(id runtimev1alpha1.WorkloadIdentity) bool {
	switch {
	case id.JWT != nil:
		return true
	case id.AWS != nil && id.AWS.EC2 != nil:
		return id.AWS.EC2.IAMRole != ""
	default:
		return false
	}
}

// sameWorkload says whether a and b are the same workload: the same EC2
// instance (partition, account, zone, instance ID) or the same JWT issuer
// and subject. Registration names are not compared: they are labels.
func sameWorkload(a, b runtimev1alpha1.WorkloadIdentity) bool {
	switch {
	case a.AWS != nil && b.AWS != nil:
		x, y := a.AWS, b.AWS
		if x.Partition != y.Partition || x.Account != y.Account || x.Zone != y.Zone || (x.EC2 == nil) != (y.EC2 == nil) {
			return false
		}
		return x.EC2 == nil || x.EC2.InstanceID == y.EC2.InstanceID
	case a.JWT != nil && b.JWT != nil:
		return a.JWT.Issuer == b.JWT.Issuer && a.JWT.Subject == b.JWT.Subject
	default:
		return false
	}
}
