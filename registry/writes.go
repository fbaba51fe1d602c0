package registry

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
)

// WriteOptions limits and retries API writes. Zero fields take the defaults
// of DefaultWriteOptions.
type WriteOptions struct {
	// QPS is the sustained rate of API writes of one process. Default 50.
	QPS float64
	// Burst is how many writes may go at once above QPS. Default 100.
	Burst int
	// Backoff between attempts of one write that failed with a retryable
	// error (conflict, timeout, throttling, unavailable). Default: 5ms
	// doubling with 10% jitter, capped at 2s, 12 attempts.
	Backoff wait.Backoff
}

// DefaultWriteOptions are the defaults of WriteOptions.
var DefaultWriteOptions = WriteOptions{
	QPS:     50,
	Burst:   100,
	Backoff: wait.Backoff{Duration: 5 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 12, Cap: 2 * time.Second},
}

type writer struct {
	limiter *rate.Limiter
	backoff wait.Backoff
}

func newWriter(o WriteOptions) *writer {
	if o.QPS <= 0 {
		o.QPS = DefaultWriteOptions.QPS
	}
	if o.Burst <= 0 {
		o.Burst = DefaultWriteOptions.Burst
	}
	if o.Backoff.Steps <= 0 {
		o.Backoff = DefaultWriteOptions.Backoff
	}
	return &writer{limiter: rate.NewLimiter(rate.Limit(o.QPS), o.Burst), backoff: o.Backoff}
}

// do runs fn, a read-modify-write of API objects, under the rate limit,
// trying it again with backoff while it fails with a retryable error.
func (w *writer) do(ctx context.Context, fn func(context.Context) error) error {
	b := w.backoff
	for attempt := 1; ; attempt++ {
		if err := w.limiter.Wait(ctx); err != nil {
			return fmt.Errorf("wait for the write rate limit: %w", err)
		}
		err := fn(ctx)
		if err == nil || !retryable(err) || b.Steps <= 1 {
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

// retryable reports whether a failed write may succeed when tried again.
func retryable(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err)
}

// waitIdle polls busy until it reports no busy writer, or ctx ends; what
// names the writes in the error.
func waitIdle(ctx context.Context, what string, busy func() int) error {
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
