package selection

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// HostForm is one parsed entry of a Sidecar egress listener's hosts:
// "<namespace>/<dns name>".
type HostForm struct {
	// Namespace is "*" (any), "." (the workload's namespace), "~" (none)
	// or a namespace name.
	Namespace string
	// Host is "*" (any), "*.<suffix>" (a wildcard) or an exact name.
	Host string
}

// ParseHostForm parses a Sidecar egress host such as "./*", "bookinfo/*",
// "*/details.bookinfo.svc.cluster.local", "~/*" or "*/example.org".
func ParseHostForm(s string) (HostForm, error) {
	ns, host, ok := strings.Cut(s, "/")
	if !ok {
		return HostForm{}, fmt.Errorf("%q is not of the form <namespace>/<dns name>", s)
	}
	switch {
	case ns == "*" || ns == "." || ns == "~":
	case len(validation.IsDNS1123Label(ns)) == 0:
	default:
		return HostForm{}, fmt.Errorf("namespace %q of %q is not \"*\", \".\", \"~\" or a namespace name", ns, s)
	}
	host = strings.ToLower(host)
	name := strings.TrimPrefix(host, "*.")
	switch {
	case host == "*":
	case host == "":
		return HostForm{}, fmt.Errorf("%q has an empty dns name", s)
	case len(validation.IsDNS1123Subdomain(name)) == 0 && !strings.Contains(name, "*"):
	default:
		return HostForm{}, fmt.Errorf("dns name %q of %q is not \"*\", \"*.<domain>\" or a domain name", host, s)
	}
	return HostForm{Namespace: ns, Host: host}, nil
}

// Matches reports whether a destination host in namespace ns is selected
// by the form, for a workload in namespace wlNS.
func (f HostForm) Matches(host, ns, wlNS string) bool {
	switch f.Namespace {
	case "~":
		return false
	case "*":
	case ".":
		if ns != wlNS {
			return false
		}
	default:
		if ns != f.Namespace {
			return false
		}
	}
	host = strings.ToLower(host)
	switch {
	case f.Host == "*":
		return true
	case strings.HasPrefix(f.Host, "*."):
		return strings.HasSuffix(host, f.Host[1:])
	default:
		return host == f.Host
	}
}

// ExportedTo reports whether an object of namespace objNS with the given
// exportTo list is visible in namespace wlNS. An empty list exports to
// every namespace (Istio's default).
func ExportedTo(exportTo []string, objNS, wlNS string) bool {
	if len(exportTo) == 0 {
		return true
	}
	for _, e := range exportTo {
		switch e = strings.TrimSpace(e); e {
		case "*":
			return true
		case ".":
			if objNS == wlNS {
				return true
			}
		default:
			if e == wlNS {
				return true
			}
		}
	}
	return false
}
