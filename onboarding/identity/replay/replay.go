// Package replay remembers single-use credentials (signed STS requests, JWT
// IDs) until they would be refused as expired anyway, so that one credential
// proves one onboarding. A Cache is per verifier (per endpoint replica) and
// bounded; a Shared store (kubestore on the API server) holds them for every
// replica of a deployment.
package replay

import (
	"sync"
	"time"
)

// Cache remembers used credentials until they expire. A nil Cache, or one
// of size 0, remembers nothing. It refuses a replay at its own replica
// without an API call; replays across replicas are refused by a Shared
// store.
type Cache struct {
	mu      sync.Mutex
	max     int
	entries map[string]time.Time // signature -> when it stops mattering
	// pruneAt is the size at which expired entries are dropped next: twice
	// the entries left by the last prune (at least MinPrune), so pruning
	// costs O(1) per reservation and the cache holds about what the
	// freshness window covers instead of filling up to max.
	pruneAt int
}

// MinPrune is the least size at which expired entries are dropped.
const MinPrune = 64

// New returns a Cache of at most maxEntries entries.
func New(maxEntries int) *Cache {
	return &Cache{max: maxEntries, entries: make(map[string]time.Time), pruneAt: MinPrune}
}

// Reserve records key until expiry and reports whether it was new (or had
// expired). It drops expired entries as the cache grows, and at capacity
// the entry that expires soonest.
func (c *Cache) Reserve(key string, expiry, now time.Time) bool {
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
		c.pruneAt = max(2*len(c.entries), MinPrune)
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

// Release forgets key, for a credential that did not prove anything (STS
// refused it or could not be reached), so that the agent may retry it.
func (c *Cache) Release(key string) {
	if c == nil || c.max <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, key)
}

// Len is the number of entries.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
