// Package policystatus writes each OnboardingPolicy's status: the
// WorkloadGroups it currently selects and when it last allowed or denied.
// A level-based reconciler computes the status from the informer cache and
// the decisions this replica's Authorizer made, and writes it only when it
// changed, under a rate limit. Every replica runs one: the selection is the
// same on all (the first write makes the others' a no-op), and each adds
// the decision times it saw, kept only when later than the stored ones.
package policystatus

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/embark-mesh/embark/onboarding/policy"
)

// maxDecisions bounds each of Decisions' maps; the oldest entry goes first.
const maxDecisions = 4096

// Decisions remembers the last allowing time of each policy and the last
// denial time of each WorkloadGroup seen by this replica. It implements
// policy.DecisionRecorder and is safe for concurrent use.
type Decisions struct {
	mu      sync.Mutex
	allowed map[types.NamespacedName]time.Time // policy -> last allowed
	denied  map[types.NamespacedName]time.Time // WorkloadGroup -> last denied
	changed chan struct{}
}

var _ policy.DecisionRecorder = (*Decisions)(nil)

// NewDecisions returns an empty Decisions.
func NewDecisions() *Decisions {
	return &Decisions{
		allowed: map[types.NamespacedName]time.Time{},
		denied:  map[types.NamespacedName]time.Time{},
		changed: make(chan struct{}, 1),
	}
}

// Allowed records that a rule of policy namespace/name allowed a workload.
func (d *Decisions) Allowed(namespace, name string, at time.Time) {
	d.record(d.allowed, types.NamespacedName{Namespace: namespace, Name: name}, at)
}

// Denied records that a workload was denied joining WorkloadGroup
// namespace/name.
func (d *Decisions) Denied(namespace, name string, at time.Time) {
	d.record(d.denied, types.NamespacedName{Namespace: namespace, Name: name}, at)
}

func (d *Decisions) record(m map[types.NamespacedName]time.Time, k types.NamespacedName, at time.Time) {
	d.mu.Lock()
	if last, ok := m[k]; !ok || at.After(last) {
		if !ok && len(m) >= maxDecisions {
			var oldest types.NamespacedName
			var oldestAt time.Time
			for k2, t := range m {
				if oldestAt.IsZero() || t.Before(oldestAt) {
					oldest, oldestAt = k2, t
				}
			}
			delete(m, oldest)
		}
		m[k] = at
	}
	d.mu.Unlock()
	select { // never blocks: one pending notification is enough
	case d.changed <- struct{}{}:
	default:
	}
}

// lastAllowed returns the last allowing time of the policy (zero if none).
func (d *Decisions) lastAllowed(p types.NamespacedName) time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.allowed[p]
}

// lastDenied returns the last denial time of any of the groups of namespace.
func (d *Decisions) lastDenied(namespace string, groups []string) time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	var last time.Time
	for _, g := range groups {
		if t := d.denied[types.NamespacedName{Namespace: namespace, Name: g}]; t.After(last) {
			last = t
		}
	}
	return last
}

// Changed receives after decisions were recorded.
func (d *Decisions) Changed() <-chan struct{} { return d.changed }
