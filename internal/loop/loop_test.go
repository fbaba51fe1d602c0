package loop

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/types"
)

// TestMain fails the package when a worker, the resync or the queue's
// delay goroutine outlives a stopped loop.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitTimeout bounds how long a test waits for the loop; it is never
// asserted as a duration.
const waitTimeout = 30 * time.Second

var (
	keyA = types.NamespacedName{Namespace: "ns", Name: "a"}
	keyB = types.NamespacedName{Namespace: "ns", Name: "b"}
	keyC = types.NamespacedName{Namespace: "ns", Name: "c"}
)

// recorder is a Func that records the keys it is given and answers with
// the error errs returns for the attempt.
type recorder struct {
	mu    sync.Mutex
	calls map[types.NamespacedName]int
	seen  chan types.NamespacedName
	errs  func(key types.NamespacedName, attempt int) error
}

func newRecorder(errs func(types.NamespacedName, int) error) *recorder {
	return &recorder{calls: map[types.NamespacedName]int{}, seen: make(chan types.NamespacedName, 100), errs: errs}
}

func (r *recorder) reconcile(_ context.Context, key types.NamespacedName) error {
	r.mu.Lock()
	r.calls[key]++
	n := r.calls[key]
	r.mu.Unlock()
	r.seen <- key
	if r.errs != nil {
		return r.errs(key, n)
	}
	return nil
}

func (r *recorder) count(key types.NamespacedName) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[key]
}

// await waits until key was reconciled n times in all.
func (r *recorder) await(t *testing.T, key types.NamespacedName, n int) {
	t.Helper()
	timeout := time.After(waitTimeout)
	for r.count(key) < n {
		select {
		case <-r.seen:
		case <-timeout:
			t.Fatalf("%s reconciled %d times, want %d", key, r.count(key), n)
		}
	}
}

// run runs l until the returned stop is called; stop returns once Run did.
func run(t *testing.T, l *Loop) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(ctx)
	}()
	return func() {
		cancel()
		select {
		case <-done:
		case <-time.After(waitTimeout):
			t.Fatal("Run did not return after its context ended")
		}
	}
}

func TestRetryPolicy(t *testing.T) {
	tests := []struct {
		name     string
		failures int
		want     time.Duration
	}{
		{name: "first failure", failures: 1, want: RetryBase},
		{name: "second failure doubles", failures: 2, want: 2 * RetryBase},
		{name: "fifth failure", failures: 5, want: 16 * RetryBase},
		{name: "capped", failures: 30, want: RetryMax},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			limiter := NewRetryLimiter()
			var got time.Duration
			for range tt.failures {
				got = limiter.When(keyA)
			}
			if got != tt.want {
				t.Errorf("delay after %d failures = %s, want %s", tt.failures, got, tt.want)
			}
			if other := limiter.When(keyB); other != RetryBase {
				t.Errorf("another key's first delay = %s, want %s: the back-off is per key", other, RetryBase)
			}
			limiter.Forget(keyA)
			if again := limiter.When(keyA); again != RetryBase {
				t.Errorf("delay after a success = %s, want %s", again, RetryBase)
			}
		})
	}
}

func TestQueuedKeysReconciledOnce(t *testing.T) {
	rec := newRecorder(nil)
	l := New(rec.reconcile, Options{Workers: 2})
	// Queued before Run: a key queued twice is reconciled once.
	l.Add(keyA)
	l.Add(keyA)
	l.Add(keyB)
	if got := l.Len(); got != 2 {
		t.Errorf("Len() = %d, want 2 distinct keys", got)
	}
	stop := run(t, l)
	rec.await(t, keyA, 1)
	rec.await(t, keyB, 1)
	l.AddAfter(keyB, time.Millisecond)
	rec.await(t, keyB, 2)
	stop()
	if got := rec.count(keyA); got != 1 {
		t.Errorf("%s reconciled %d times, want 1", keyA, got)
	}
}

func TestFailureRetriedWithBackoff(t *testing.T) {
	var logs syncBuffer
	rec := newRecorder(func(key types.NamespacedName, attempt int) error {
		if attempt <= 2 {
			return errors.New("conflict")
		}
		return nil
	})
	l := New(rec.reconcile, Options{Name: "write status", KeyName: "registration", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	l.Add(keyA)
	stop := run(t, l)
	rec.await(t, keyA, 3)
	stop()
	if got := rec.count(keyA); got != 3 {
		t.Errorf("%s reconciled %d times, want 3 (two failures, one success)", keyA, got)
	}
	out := logs.String()
	if n := strings.Count(out, `msg="write status failed; retrying" registration=ns/a error=conflict`); n != 2 {
		t.Errorf("retry log lines = %d, want 2; logs:\n%s", n, out)
	}
}

func TestResyncQueuesKeys(t *testing.T) {
	rec := newRecorder(nil)
	listed := make(chan struct{}, 10)
	l := New(rec.reconcile, Options{Keys: func(context.Context) ([]types.NamespacedName, error) {
		listed <- struct{}{}
		return []types.NamespacedName{keyA, keyB}, nil
	}, Resync: time.Hour})
	stop := run(t, l)
	rec.await(t, keyA, 1)
	rec.await(t, keyB, 1)
	stop()
	if len(listed) != 1 {
		t.Errorf("Keys listed %d times, want once when Run starts", len(listed))
	}
}

func TestShutdownDrainsWithoutRetrying(t *testing.T) {
	started := make(chan struct{})
	var mu sync.Mutex
	var finished []types.NamespacedName
	calls := map[types.NamespacedName]int{}
	reconcile := func(ctx context.Context, key types.NamespacedName) error {
		mu.Lock()
		calls[key]++
		mu.Unlock()
		if key == keyA {
			close(started)
			<-ctx.Done() // in flight when the loop stops
		}
		mu.Lock()
		finished = append(finished, key)
		mu.Unlock()
		return ctx.Err()
	}
	l := New(reconcile, Options{})
	// Keys added before Run have no order among themselves: keyB is either
	// done already or queued behind keyA, which the one worker holds in
	// flight when the loop stops.
	l.Add(keyA)
	l.Add(keyB)
	stop := run(t, l)
	<-started
	stop()
	mu.Lock()
	defer mu.Unlock()
	if len(finished) != 2 || !slices.Contains(finished, keyA) || !slices.Contains(finished, keyB) {
		t.Errorf("finished before Run returned: %v, want %v and %v (in-flight and queued keys drained)", finished, keyA, keyB)
	}
	if calls[keyA] != 1 || calls[keyB] != 1 {
		t.Errorf("calls = %v, want one each: a failure after the context ended is not retried", calls)
	}
	l.Add(keyA) // after the loop stopped: ignored
	if got := l.Len(); got != 0 {
		t.Errorf("Len() after stop = %d, want 0", got)
	}
}

func TestKeysBeforeRun(t *testing.T) {
	rec := newRecorder(nil)
	l := New(rec.reconcile, Options{})
	l.Add(keyA)
	l.AddAfter(keyB, time.Millisecond)
	l.AddAfter(keyC, time.Hour)
	if got := l.Len(); got != 1 {
		t.Errorf("Len() before Run = %d, want 1 (only keyA is due now)", got)
	}
	stop := run(t, l)
	rec.await(t, keyA, 1)
	rec.await(t, keyB, 1)
	stop()
	if got := rec.count(keyC); got != 0 {
		t.Errorf("%s reconciled %d times before its delay passed, want 0", keyC, got)
	}
}

func TestNeverRunLeaksNothing(t *testing.T) {
	rec := newRecorder(nil)
	l := New(rec.reconcile, Options{Keys: func(context.Context) ([]types.NamespacedName, error) { return nil, nil }})
	l.Add(keyA)
	l.AddAfter(keyB, time.Hour)
	goleak.VerifyNone(t) // a Loop made, fed and never run starts no goroutine
	l.ShutDown()
	l.Run(t.Context()) // after ShutDown: returns at once, reconciles nothing
	if got := rec.count(keyA); got != 0 {
		t.Errorf("%s reconciled %d times after ShutDown, want 0", keyA, got)
	}
	goleak.VerifyNone(t)
}

// syncBuffer is a bytes.Buffer safe for the loop's workers and the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
