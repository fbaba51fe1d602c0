package aws

import (
	"sync"
	"time"
)

// replayCache remembers the signatures of signed STS requests that were
// used, until they would be refused as stale anyway, so that one signed
// request proves one onboarding. It is per verifier (per endpoint replica);
// the freshness window bounds what a replay across replicas can achieve.
type replayCache struct {
	mu      sync.Mutex
	max     int
	entries map[string]time.Time // signature -> when it stops mattering
	// pruneAt is the size at which expired entries are dropped next: twice
	// the entries left by the last prune (at least minPrune), so pruning
	// costs O(1) per reservation and the cache holds about what the
	// freshness window covers instead of filling up to max.
	pruneAt int
}

const minPrune = 64

func newReplayCache(maxEntries int) *replayCache {
	return &replayCache{max: maxEntries, entries: make(map[string]time.Time), pruneAt: minPrune}
}

// reserve records key until expiry and reports whether it was new (or had
// expired). It drops expired entries as the cache grows, and at capacity
// the entry that expires soonest.
func (c *replayCache) reserve(key string, expiry, now time.Time) bool {
	if c == nil || c.max <= 0 {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if exp, ok := c.entries[key]; ok && exp.After(now) {
		return false
	}
	if len(c.entries) >= c.max || len(c.entries) >= c.pruneAt {
		for k, exp := range c.entries {
			if !exp.After(now) {
				delete(c.entries, k)
			}
		}
		c.pruneAt = max(2*len(c.entries), minPrune)
	}
	if len(c.entries) >= c.max {
		var oldestKey string
		var oldest time.Time
		for k, exp := range c.entries {
			if oldestKey == "" || exp.Before(oldest) {
				oldestKey, oldest = k, exp
			}
		}
		delete(c.entries, oldestKey)
	}
	c.entries[key] = expiry
	return true
}

// release forgets key, for a request that did not prove anything (STS
// refused it or could not be reached), so that the agent may retry it.
func (c *replayCache) release(key string) {
	if c == nil || c.max <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, key)
}

func (c *replayCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
