package aws

import (
	"net"
	"net/netip"

	"github.com/embark-mesh/embark/onboarding/identity"
)

// ReuseDecision decides whether an instance identity document that is
// already bound to a live registration may be accepted again. A document is
// not a secret (anything on the instance can read it, and it never changes),
// so a second presentation is accepted only from one of the addresses the
// registration is bound to, or when it comes with a fresh STS proof of the
// instance's role session (hasFreshSTSProof, i.e. the identity's STSProven).
// Otherwise it returns a *identity.VerificationError with
// ReasonDocumentReused, which the registry should refuse and report.
//
// Addresses may be given with or without a port; IPv4-mapped IPv6 addresses
// equal their IPv4 form.
func ReuseDecision(boundAddresses []string, requestAddress string, hasFreshSTSProof bool) error {
	if hasFreshSTSProof {
		return nil
	}
	req, ok := parseAddr(requestAddress)
	if !ok {
		return identity.Refuse(identity.ReasonDocumentReused, "document is bound to a live registration and the request address %q cannot be compared; present a fresh STS proof", requestAddress)
	}
	for _, b := range boundAddresses {
		if addr, ok := parseAddr(b); ok && addr == req {
			return nil
		}
	}
	return identity.Refuse(identity.ReasonDocumentReused, "document is bound to a live registration at %v and was presented from %s without a fresh STS proof", boundAddresses, req)
}

func parseAddr(s string) (netip.Addr, bool) {
	if h, _, err := net.SplitHostPort(s); err == nil {
		s = h
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}
