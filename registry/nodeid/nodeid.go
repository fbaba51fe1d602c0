// Package nodeid is the one place that builds and parses the Istio node ID of
// a registered workload's sidecar:
//
//	sidecar~<ip>~<registration>.<namespace>~<namespace>.svc.cluster.local
//
// The onboarding endpoint builds it into the sidecar's bootstrap; the xDS
// server parses it to find the registration a stream names. A registration
// name may hold dots (a WorkloadGroup "ratings.v1", a JWT subject
// "vm-01.example.com"); a namespace never does, so the name is everything
// before the last ".<namespace>", the namespace being the first label of the
// DNS-domain field. BuildRouter builds the node ID of a gateway (router~...)
// the same way, for tests that play one.
package nodeid

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Type is the node type of every workload sidecar.
const Type = "sidecar"

// RouterType is the node type of a gateway, such as Istio's east-west
// gateway; Parse refuses it.
const RouterType = "router"

// DNSDomain is the cluster DNS domain written into built node IDs.
const DNSDomain = "cluster.local"

// ID is what a workload sidecar's node ID says.
type ID struct {
	// IP is the proxy's address, as written.
	IP string
	// Registration is the WorkloadAutoRegistration the ID names.
	Registration types.NamespacedName
}

// ErrMalformed is wrapped by every error of Parse.
var ErrMalformed = errors.New("malformed node ID")

// Build returns the node ID of the sidecar at ip of registration reg.
func Build(ip string, reg types.NamespacedName) string { return build(Type, ip, reg) }

// BuildRouter returns the node ID of the gateway pod at ip:
// router~<ip>~<pod>.<namespace>~<namespace>.svc.cluster.local.
func BuildRouter(ip string, pod types.NamespacedName) string { return build(RouterType, ip, pod) }

// build returns the node ID of a proxy of type typ at ip named by obj.
func build(typ, ip string, obj types.NamespacedName) string {
	return typ + "~" + ip + "~" + obj.Name + "." + obj.Namespace + "~" + obj.Namespace + ".svc." + DNSDomain
}

// String is Build(id.IP, id.Registration).
func (id ID) String() string { return Build(id.IP, id.Registration) }

// Parse parses a workload sidecar's node ID. The namespace is the first
// label of the DNS-domain field (<namespace>.svc.<domain>) and must be a
// DNS-1123 label; the registration name is what precedes ".<namespace>" at
// the end of the third field and must be a DNS-1123 subdomain; the address
// must be non-empty. Any other domain than cluster.local is accepted.
func Parse(s string) (ID, error) {
	bad := func(format string, args ...any) (ID, error) {
		return ID{}, fmt.Errorf("%w %.256q: %s", ErrMalformed, s, fmt.Sprintf(format, args...))
	}
	parts := strings.Split(s, "~")
	if len(parts) != 4 {
		return bad("want %s~<ip>~<registration>.<namespace>~<namespace>.svc.<domain>", Type)
	}
	typ, ip, name, domain := parts[0], parts[1], parts[2], parts[3]
	if typ != Type {
		return bad("type %.64q, want %s", typ, Type)
	}
	if ip == "" {
		return bad("no address")
	}
	ns, rest, ok := strings.Cut(domain, ".")
	if !ok || !strings.HasPrefix(rest, "svc.") || len(rest) == len("svc.") {
		return bad("DNS domain %.256q is not <namespace>.svc.<domain>", domain)
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return bad("namespace %.64q: %s", ns, strings.Join(errs, "; "))
	}
	reg, ok := strings.CutSuffix(name, "."+ns)
	if !ok || reg == "" {
		return bad("%.256q is not <registration>.%s", name, ns)
	}
	if errs := validation.IsDNS1123Subdomain(reg); len(errs) > 0 {
		return bad("registration name %.256q: %s", reg, strings.Join(errs, "; "))
	}
	return ID{IP: ip, Registration: types.NamespacedName{Namespace: ns, Name: reg}}, nil
}
