package registry

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// StreamWorkload names the registration a sidecar's ADS streams are bound
// to: what the xDS server reports stream opens, closes and health reports
// for, and what registry/presence writes them on.
type StreamWorkload struct {
	// Key is the registration's namespace and name.
	Key types.NamespacedName
	// UID is the registration's UID; events of an earlier registration of
	// the same name never touch a newer one.
	UID types.UID
	// Group is the WorkloadGroup's name (a metrics label).
	Group string
}

// HealthReport is one health report of a workload, as its sidecar sent it
// (an istio.v1.HealthInformation request on its ADS stream).
type HealthReport struct {
	// Healthy is false when the report carries an error detail.
	Healthy bool
	// Message is the error detail's message, if any.
	Message string
	// At is when the report arrived.
	At time.Time
}
