package configsource

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// batchKey identifies one input object.
type batchKey struct {
	kind string
	obj  types.NamespacedName
}

// debouncer collects changes until the inputs have been quiet for quiet, or
// the oldest change waited max. Safe for concurrent use.
type debouncer struct {
	quiet, max time.Duration

	mu      sync.Mutex
	first   time.Time // of the pending batch
	last    time.Time
	pending map[batchKey]change
	signal  chan struct{} // has a value when a batch is pending
}

func newDebouncer(quiet time.Duration) *debouncer {
	return &debouncer{quiet: quiet, max: 10 * quiet, pending: map[batchKey]change{}, signal: make(chan struct{}, 1)}
}

// add records that obj changed from old (nil: created) to updated (nil:
// deleted) at now. Changes of one object within a batch merge: the batch
// keeps its first old and last updated state.
func (d *debouncer) add(kind string, old, updated client.Object, now time.Time) {
	o := old
	if o == nil {
		o = updated
	}
	k := batchKey{kind: kind, obj: types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.pending) == 0 {
		d.first = now
	}
	d.last = now
	c, seen := d.pending[k]
	if !seen {
		c.old = old
	}
	c.new = updated
	d.pending[k] = c
	select {
	case d.signal <- struct{}{}:
	default:
	}
}

// wait says how long until the pending batch is due; due is true when it is
// (or nothing is pending: then ok is false).
func (d *debouncer) wait(now time.Time) (wait time.Duration, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.pending) == 0 {
		return 0, false
	}
	quietAt, maxAt := d.last.Add(d.quiet), d.first.Add(d.max)
	due := quietAt
	if maxAt.Before(due) {
		due = maxAt
	}
	if !now.Before(due) {
		return 0, true
	}
	return due.Sub(now), true
}

// take returns the pending batch and when its first change happened, and
// starts a new batch.
func (d *debouncer) take() ([]change, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]change, 0, len(d.pending))
	for _, c := range d.pending {
		out = append(out, c)
	}
	first := d.first
	d.pending = map[batchKey]change{}
	return out, first
}
