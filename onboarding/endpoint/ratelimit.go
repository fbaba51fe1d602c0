package endpoint

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/peer"
)

// DefaultVerifyLimit allows each source address 5 credential verifications
// a second with bursts of 20.
var DefaultVerifyLimit = RateLimit{PerSecond: 5, Burst: 20, Sources: 10_000}

// RateLimit is a per-source token bucket.
type RateLimit struct {
	// PerSecond is the sustained rate per source; negative disables the
	// limit. Default (0): DefaultVerifyLimit.
	PerSecond float64
	// Burst per source. Default: DefaultVerifyLimit.Burst.
	Burst int
	// Sources bounds how many sources are tracked; beyond it the least
	// recently seen are forgotten. Default: DefaultVerifyLimit.Sources.
	Sources int
}

func (l *RateLimit) setDefaults() {
	if l.PerSecond == 0 {
		l.PerSecond = DefaultVerifyLimit.PerSecond
	}
	if l.Burst <= 0 {
		l.Burst = DefaultVerifyLimit.Burst
	}
	if l.Sources <= 0 {
		l.Sources = DefaultVerifyLimit.Sources
	}
}

// sourceLimiter holds one token bucket per source address (the gRPC peer;
// behind a proxy, the proxy: set the limit for the proxy's aggregate).
type sourceLimiter struct {
	limit RateLimit
	mu    sync.Mutex
	seen  map[netip.Addr]*sourceBucket
}

type sourceBucket struct {
	lim  *rate.Limiter
	last time.Time
}

func newSourceLimiter(l RateLimit) *sourceLimiter {
	return &sourceLimiter{limit: l, seen: map[netip.Addr]*sourceBucket{}}
}

// allow takes a token of the request's source.
func (s *sourceLimiter) allow(ctx context.Context) bool {
	if s == nil || s.limit.PerSecond < 0 {
		return true
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return true
	}
	src, ok := peerAddr(p.Addr)
	if !ok {
		return true
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.seen[src]
	if b == nil {
		if len(s.seen) >= s.limit.Sources {
			s.evictLocked()
		}
		b = &sourceBucket{lim: rate.NewLimiter(rate.Limit(s.limit.PerSecond), s.limit.Burst)}
		s.seen[src] = b
	}
	b.last = now
	return b.lim.AllowN(now, 1)
}

// evictLocked forgets full buckets (idle sources) and, if none, the oldest.
func (s *sourceLimiter) evictLocked() {
	var oldest netip.Addr
	var oldestAt time.Time
	for a, b := range s.seen {
		if b.lim.Tokens() >= float64(s.limit.Burst) {
			delete(s.seen, a)
			continue
		}
		if oldestAt.IsZero() || b.last.Before(oldestAt) {
			oldest, oldestAt = a, b.last
		}
	}
	if len(s.seen) >= s.limit.Sources {
		delete(s.seen, oldest)
	}
}
