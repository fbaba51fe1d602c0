// Package loop is the one shape of Embark's background writers: a queue of
// object keys filled by informer watches, by a periodic resync and by the
// writer itself, workers that run a level-based reconcile function on each
// key, and one retry policy for a key whose reconcile failed (RetryBase
// doubling to RetryMax). The registry's lifecycle reconcilers, its
// ConfigurationEnforced writer, the rollout controller and the
// OnboardingPolicy status writer all run on it.
package loop

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The retry policy of every loop: a key whose reconcile failed is queued
// again after RetryBase, and each further failure in a row doubles the
// delay up to RetryMax; a success resets it. RetryBase is about one
// informer round trip, so a conflict is retried from a fresh cache read at
// once. RetryMax is the default resync period: a key that keeps failing is
// tried again at least as often as a resync would queue it, and an API
// server that is down is asked about each key at most once a minute.
// Writes are paced separately, by the replica's one write budget.
const (
	RetryBase = 100 * time.Millisecond
	RetryMax  = time.Minute
)

// DefaultResync is Options.Resync's default.
const DefaultResync = time.Minute

// Func reconciles the object of key with the state it should have. It
// reads the current state (an informer cache) rather than relying on the
// event that queued key, so queuing a key twice is harmless. An error
// queues key again after the retry policy's delay.
type Func func(ctx context.Context, key types.NamespacedName) error

// Options configures a Loop. Every field documents its default.
type Options struct {
	// Name says what the loop does, in its log lines ("sweep", "drift").
	// Default "reconcile".
	Name string
	// KeyName names the key in log lines ("registration"). Default: the
	// key is not logged (a loop of one key).
	KeyName string
	// Workers is how many keys are reconciled at once. Default 1.
	Workers int
	// Keys lists what a resync queues. Default: none, no resync.
	Keys func(context.Context) ([]types.NamespacedName, error)
	// Resync is how often Keys are queued, besides once when Run starts.
	// Default DefaultResync.
	Resync time.Duration
	// Logger. Default: discard.
	Logger *slog.Logger
}

func (o *Options) setDefaults() {
	if o.Name == "" {
		o.Name = "reconcile"
	}
	if o.Workers <= 0 {
		o.Workers = 1
	}
	if o.Resync <= 0 {
		o.Resync = DefaultResync
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Informers gets the informer of an object's kind (controller-runtime's
// cache.Cache has this method).
type Informers interface {
	GetInformer(ctx context.Context, obj client.Object, opts ...crcache.InformerGetOption) (crcache.Informer, error)
}

// Loop runs a Func on queued keys. Make it with New, add watches, then Run
// it once. Add and AddAfter may be called at any time: before Run the keys
// wait for it, after the loop stopped they are dropped. A Loop starts no
// goroutine before Run, so one that is made and never run leaks nothing.
type Loop struct {
	reconcile Func
	opts      Options

	mu      sync.Mutex
	queue   workqueue.TypedRateLimitingInterface[types.NamespacedName] // made by Run
	pending map[types.NamespacedName]time.Time                         // before Run: key -> when it is due
	stopped bool
	synced  []toolscache.InformerSynced
	removes []func()
}

// New returns a Loop that reconciles keys with reconcile.
func New(reconcile Func, opts Options) *Loop {
	opts.setDefaults()
	return &Loop{reconcile: reconcile, opts: opts, pending: map[types.NamespacedName]time.Time{}}
}

// NewRetryLimiter returns the retry policy as a workqueue rate limiter:
// per key, RetryBase doubling to RetryMax.
func NewRetryLimiter() workqueue.TypedRateLimiter[types.NamespacedName] {
	return workqueue.NewTypedItemExponentialFailureRateLimiter[types.NamespacedName](RetryBase, RetryMax)
}

// Add queues key now.
func (l *Loop) Add(key types.NamespacedName) { l.AddAfter(key, 0) }

// AddAfter queues key once d has passed (a deadline the reconcile found).
func (l *Loop) AddAfter(key types.NamespacedName, d time.Duration) {
	l.mu.Lock()
	q := l.queue
	if q == nil && !l.stopped {
		due := time.Now().Add(d)
		if at, ok := l.pending[key]; !ok || due.Before(at) {
			l.pending[key] = due
		}
	}
	l.mu.Unlock()
	if q != nil {
		q.AddAfter(key, d) // a stopped queue drops it
	}
}

// Len is how many keys are queued now (not those waiting for a delay).
func (l *Loop) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.queue != nil {
		return l.queue.Len()
	}
	n, now := 0, time.Now()
	for _, due := range l.pending {
		if !due.After(now) {
			n++
		}
	}
	return n
}

// start makes the queue with the keys added so far; nil when the loop was
// shut down already.
func (l *Loop) start() workqueue.TypedRateLimitingInterface[types.NamespacedName] {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return nil
	}
	l.queue = workqueue.NewTypedRateLimitingQueue(NewRetryLimiter())
	now := time.Now()
	for key, due := range l.pending {
		l.queue.AddAfter(key, due.Sub(now))
	}
	l.pending = nil
	return l.queue
}

// Watch adds h to the informer of obj's kind; Run waits for it to sync, and
// the handler is removed when the loop stops. h usually queues the keys an
// event concerns with Add.
func (l *Loop) Watch(ctx context.Context, informers Informers, obj client.Object, h toolscache.ResourceEventHandler) error {
	inf, err := informers.GetInformer(ctx, obj)
	if err != nil {
		return fmt.Errorf("watch %T: %w", obj, err)
	}
	reg, err := inf.AddEventHandler(h)
	if err != nil {
		return fmt.Errorf("watch %T: %w", obj, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.synced = append(l.synced, reg.HasSynced)
	l.removes = append(l.removes, func() { _ = inf.RemoveEventHandler(reg) })
	return nil
}

// WaitForSync waits until every watch has delivered its informer's initial
// list; false when ctx ended first.
func (l *Loop) WaitForSync(ctx context.Context) bool {
	l.mu.Lock()
	synced := append([]toolscache.InformerSynced(nil), l.synced...)
	l.mu.Unlock()
	return toolscache.WaitForCacheSync(ctx.Done(), synced...)
}

// Run waits for the watches to sync, then reconciles queued keys with
// Options.Workers workers, and queues Options.Keys now and every
// Options.Resync, until ctx ends. It returns once the workers have handled
// what was queued (with ctx ended, a failure is not retried) and stopped,
// and the watches are removed.
func (l *Loop) Run(ctx context.Context) {
	defer l.ShutDown()
	q := l.start()
	if q == nil || !l.WaitForSync(ctx) {
		return // shut down already, or ctx ended
	}
	var wg sync.WaitGroup
	for range l.opts.Workers {
		wg.Go(func() {
			for l.processNext(ctx, q) {
			}
		})
	}
	if l.opts.Keys != nil {
		l.resync(ctx, q)
	} else {
		<-ctx.Done()
	}
	q.ShutDown()
	wg.Wait()
}

// ShutDown removes the watches and shuts the queue down: Run's workers
// finish what is queued and stop. Run calls it; call it yourself when Run
// is never reached (a watch failed).
func (l *Loop) ShutDown() {
	l.mu.Lock()
	removes, q := l.removes, l.queue
	l.removes, l.pending, l.stopped = nil, nil, true
	l.mu.Unlock()
	for _, remove := range removes {
		remove()
	}
	if q != nil {
		q.ShutDown()
	}
}

// processNext reconciles one queued key; false when the queue shut down and
// is empty. A failure queues the key again after the retry policy's delay,
// unless ctx ended.
func (l *Loop) processNext(ctx context.Context, q workqueue.TypedRateLimitingInterface[types.NamespacedName]) bool {
	key, shutdown := q.Get()
	if shutdown {
		return false
	}
	defer q.Done(key)
	if err := l.reconcile(ctx, key); err != nil {
		if ctx.Err() == nil {
			l.logFailure(key, err)
			q.AddRateLimited(key)
		}
		return true
	}
	q.Forget(key)
	return true
}

func (l *Loop) logFailure(key types.NamespacedName, err error) {
	var attrs []any
	if l.opts.KeyName != "" {
		attrs = append(attrs, l.opts.KeyName, key.String())
	}
	l.opts.Logger.Error(l.opts.Name+" failed; retrying", append(attrs, "error", err)...)
}

// resync queues every key Options.Keys lists now and every Options.Resync
// until ctx ends.
func (l *Loop) resync(ctx context.Context, q workqueue.TypedInterface[types.NamespacedName]) {
	t := time.NewTicker(l.opts.Resync)
	defer t.Stop()
	for {
		keys, err := l.opts.Keys(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			l.opts.Logger.Error("list for a resync", "loop", l.opts.Name, "error", err)
		}
		for _, k := range keys {
			q.Add(k)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
