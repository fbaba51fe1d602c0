// Package apicheck holds what the endpoint's optional cloud API checks (the
// EC2 instance profile, ECS task, Compute Engine instance and Azure VM
// checks) share: a bounded cache of answers that expire, and the budget of
// their calls (a token-bucket rate limit for every caller together and a
// timeout per call). Each check keeps its own API client, parsing and
// refusals.
package apicheck

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// The defaults every check documents.
const (
	// DefaultRate and DefaultBurst bound a check's API calls per second.
	DefaultRate  = 5
	DefaultBurst = 10
	// DefaultCacheTTL is how long an answer is reused.
	DefaultCacheTTL = 30 * time.Second
	// DefaultTimeout bounds one API call.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxEntries bounds a cache.
	DefaultMaxEntries = 4096
)

// Options are what every check's options share; each check's
// CheckerOptions (profile.Options for the instance profile check) embeds
// them beside its own client settings. Every field documents its default.
type Options struct {
	// Rate and Burst bound the check's API calls per second (token bucket),
	// for every caller together; a check that needs a call over it fails
	// with the check's ErrRateLimited at once (its caller retries).
	// Defaults DefaultRate (5/s) and DefaultBurst (10).
	Rate  float64
	Burst int
	// CacheTTL is how long an answer of the API is reused: a workload
	// stopped, deleted or changed since is seen after at most this long.
	// Default: the check's own (DefaultCacheTTL, 30s, unless the check says
	// otherwise).
	CacheTTL time.Duration
	// Timeout bounds each API call. Default DefaultTimeout (10s).
	Timeout time.Duration
	// Clock. Default time.Now.
	Clock func() time.Time
	// Logger. Default slog.Default().
	Logger *slog.Logger
}

// SetDefaults fills in o's zero fields; cacheTTL is the check's default
// time to live.
func (o *Options) SetDefaults(cacheTTL time.Duration) {
	if o.Rate <= 0 {
		o.Rate = DefaultRate
	}
	if o.Burst <= 0 {
		o.Burst = DefaultBurst
	}
	if o.CacheTTL <= 0 {
		o.CacheTTL = cacheTTL
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Calls returns the budget of o's calls; limited is the check's error over
// the rate limit.
func (o *Options) Calls(limited error) *Calls {
	return NewCalls(CallOptions{Rate: o.Rate, Burst: o.Burst, Timeout: o.Timeout, Clock: o.Clock, Limited: limited})
}

// ErrRateLimited is what Calls.Start returns over the rate limit, unless
// the Calls were given an error of the check's own.
var ErrRateLimited = errors.New("API checks over their rate limit")

// Cache holds answers by key until they expire, a bounded number of them. It is
// safe for concurrent use.
type Cache[K comparable, V any] struct {
	mu      sync.Mutex
	entries map[K]entry[V]
	max     int
	clock   func() time.Time
}

type entry[V any] struct {
	value   V
	expires time.Time
}

// NewCache returns a Cache of at most bound entries (DefaultMaxEntries when
// bound <= 0) whose expiry is read on clock (time.Now when nil).
func NewCache[K comparable, V any](bound int, clock func() time.Time) *Cache[K, V] {
	if bound <= 0 {
		bound = DefaultMaxEntries
	}
	if clock == nil {
		clock = time.Now
	}
	return &Cache[K, V]{entries: map[K]entry[V]{}, max: bound, clock: clock}
}

// Get returns the answer stored for key, if it has not expired.
func (c *Cache[K, V]) Get(key K) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok || !c.clock().Before(e.expires) {
		var zero V
		return zero, false
	}
	return e.value, true
}

// Put stores v for key for ttl. A full cache first drops its expired
// answers, then arbitrary ones: it never holds more than its bound.
func (c *Cache[K, V]) Put(key K, v V, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock()
	if _, ok := c.entries[key]; !ok && len(c.entries) >= c.max {
		for k, e := range c.entries {
			if !now.Before(e.expires) {
				delete(c.entries, k)
			}
		}
		for k := range c.entries {
			if len(c.entries) < c.max {
				break
			}
			delete(c.entries, k)
		}
	}
	c.entries[key] = entry[V]{value: v, expires: now.Add(ttl)}
}

// Len is the number of answers held, expired ones included.
func (c *Cache[K, V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// Calls is the budget of a check's API calls: a rate limit shared by every
// caller and a timeout per call.
type Calls struct {
	limit   *rate.Limiter
	timeout time.Duration
	clock   func() time.Time
	limited error
}

// CallOptions configures Calls. Every field documents its default.
type CallOptions struct {
	// Rate and Burst bound the calls per second (token bucket). Defaults
	// DefaultRate and DefaultBurst.
	Rate  float64
	Burst int
	// Timeout bounds each call. Default DefaultTimeout.
	Timeout time.Duration
	// Clock. Default time.Now.
	Clock func() time.Time
	// Limited is the error Start returns over the rate limit. Default
	// ErrRateLimited.
	Limited error
}

// NewCalls returns the budget o describes.
func NewCalls(o CallOptions) *Calls {
	if o.Rate <= 0 {
		o.Rate = DefaultRate
	}
	if o.Burst <= 0 {
		o.Burst = DefaultBurst
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.Limited == nil {
		o.Limited = ErrRateLimited
	}
	return &Calls{limit: rate.NewLimiter(rate.Limit(o.Rate), o.Burst), timeout: o.Timeout, clock: o.Clock, limited: o.Limited}
}

// Start takes one call from the budget: it returns the call's context,
// bounded by the timeout, or the Limited error when the rate limit has no
// call left now (the check does not wait: its caller retries).
func (c *Calls) Start(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if !c.limit.AllowN(c.clock(), 1) {
		return nil, nil, c.limited
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	return ctx, cancel, nil
}
