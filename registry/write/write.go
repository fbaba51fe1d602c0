// Package write is the API write budget of one endpoint replica: one Writer,
// built once per replica (cmd/onboarding-endpoint/app) and injected into every
// component that writes registrations, WorkloadEntries and Secrets
// (registry.Registrar, presence's connection tracker and health mirror,
// lifecycle's sweeper, drift and entry reconcilers, enforcement.ConditionWriter), so
// the documented registration.writeQPS / writeBurst bound the replica's
// writes as a whole. Each write is a read-modify-write retried with bounded
// backoff while it fails with a retryable error.
//
// The replica's Lease renewal (one write per renew interval) is the one write
// outside the budget: a saturated budget must never let the Lease lapse.
//
// Defaults are defined here only, and a zero field means its default
// everywhere (configuration file, Options of every component).
package write

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Defaults of Options, sized for a fleet of 1,000 workloads per replica
// from what one kube-apiserver sustains (benchmarks/streams measures both in
// one run: its StatusWrites figure is the API server's rate for 1,000
// concurrent status updates of registrations, a read and an update each):
//
//   - a disconnect costs one write and a connect two, so 1,000 simultaneous
//     disconnects are 1,000 writes and a reconnect storm of 1,000 to another
//     replica 2,000; stored within 3 s (1 s of it the disconnect delay) and
//     10 s, they need a burst of 1,000 and a sustained rate that refills it
//     within a few seconds;
//   - the sustained rate stays under what one API server stores (the
//     benchmark's StatusWrites; check it for your API server), so one
//     replica alone never saturates it; the burst is absorbed by the API server's own queueing
//     (API Priority and Fairness), which is what protects it from several
//     replicas and other clients at once.
//
// Lower them (registration.writeQPS / writeBurst) for a smaller API server
// or a shared one: a saturated budget only delays connection and health
// states (each is retried until stored), never loses them.
const (
	// DefaultQPS is the default sustained write rate of one replica.
	DefaultQPS = 400.0
	// DefaultBurst is the default number of writes allowed at once above
	// the sustained rate.
	DefaultBurst = 1000
)

// DefaultBackoff is Options.Backoff's default: 5ms doubling with 10% jitter,
// capped at 2s, 12 attempts.
var DefaultBackoff = wait.Backoff{Duration: 5 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 12, Cap: 2 * time.Second}

// Options is the write budget of one replica. A zero field takes its default.
type Options struct {
	// QPS is the sustained rate of API writes of the replica: every attempt
	// of every write of every component that shares the Writer counts.
	// Default DefaultQPS (400).
	QPS float64
	// Burst is how many writes may go at once above QPS. Default
	// DefaultBurst (1,000).
	Burst int
	// Backoff between attempts of one write that failed with a retryable
	// error (conflict, timeout, throttling, unavailable). Default
	// DefaultBackoff.
	Backoff wait.Backoff
}

// WithDefaults returns o with each zero (or negative) field set to its
// default.
func (o Options) WithDefaults() Options {
	if o.QPS <= 0 {
		o.QPS = DefaultQPS
	}
	if o.Burst <= 0 {
		o.Burst = DefaultBurst
	}
	if o.Backoff.Steps <= 0 {
		o.Backoff = DefaultBackoff
	}
	return o
}

// Writer runs API writes under one rate limit, retrying each with bounded
// backoff. It is safe for concurrent use; share one per replica.
type Writer struct {
	opts    Options
	limiter *rate.Limiter
}

// New returns a Writer with the budget o (zero fields: defaults).
func New(o Options) *Writer {
	o = o.WithDefaults()
	return &Writer{opts: o, limiter: rate.NewLimiter(rate.Limit(o.QPS), o.Burst)}
}

// OrDefault returns w, or a Writer of its own with the default budget when w
// is nil (a component built alone, as in its tests; a replica injects its
// one Writer).
func OrDefault(w *Writer) *Writer {
	if w == nil {
		return New(Options{})
	}
	return w
}

// Options returns the Writer's budget, defaults applied.
func (w *Writer) Options() Options { return w.opts }

// Do runs fn, a read-modify-write of API objects, under the rate limit,
// trying it again with backoff while it fails with a retryable error.
func (w *Writer) Do(ctx context.Context, fn func(context.Context) error) error {
	b := w.opts.Backoff
	for attempt := 1; ; attempt++ {
		if err := w.limiter.Wait(ctx); err != nil {
			return fmt.Errorf("wait for the write rate limit: %w", err)
		}
		err := fn(ctx)
		if err == nil || !Retryable(err) || b.Steps <= 1 {
			return err
		}
		delay := b.Step()
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("after %d attempts: %w", attempt, err)
		case <-t.C:
		}
	}
}

// Retryable reports whether a failed write may succeed when tried again.
func Retryable(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err)
}

// WaitIdle polls busy until it reports no busy writer, or ctx ends; what
// names the writes in the error.
func WaitIdle(ctx context.Context, what string, busy func() int) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		n := busy()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("flush %s: %d writers busy: %w", what, n, context.Cause(ctx))
		case <-t.C:
		}
	}
}
