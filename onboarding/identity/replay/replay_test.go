package replay

import (
	"fmt"
	"testing"
	"time"
)

func TestReplayCache(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	tests := []struct {
		name string
		max  int
		run  func(t *testing.T, c *Cache)
	}{
		{
			name: "second reservation refused until expiry",
			max:  10,
			run: func(t *testing.T, c *Cache) {
				if !c.Reserve("a", now.Add(time.Minute), now) {
					t.Fatal("first reservation refused")
				}
				if c.Reserve("a", now.Add(time.Minute), now.Add(30*time.Second)) {
					t.Fatal("replay within expiry accepted")
				}
				if !c.Reserve("a", now.Add(3*time.Minute), now.Add(2*time.Minute)) {
					t.Fatal("reservation after expiry refused")
				}
			},
		},
		{
			name: "release forgets",
			max:  10,
			run: func(t *testing.T, c *Cache) {
				c.Reserve("a", now.Add(time.Minute), now)
				c.Release("a")
				if !c.Reserve("a", now.Add(time.Minute), now) {
					t.Fatal("released key refused")
				}
			},
		},
		{
			name: "bounded: expired entries dropped first, then the soonest to expire",
			max:  3,
			run: func(t *testing.T, c *Cache) {
				c.Reserve("old", now.Add(time.Second), now)
				c.Reserve("b", now.Add(10*time.Minute), now)
				c.Reserve("c", now.Add(5*time.Minute), now)
				later := now.Add(time.Minute)
				c.Reserve("d", later.Add(10*time.Minute), later) // drops "old"
				if c.Len() != 3 {
					t.Fatalf("%d entries, want 3", c.Len())
				}
				c.Reserve("e", later.Add(10*time.Minute), later) // evicts "c"
				if c.Len() != 3 {
					t.Fatalf("%d entries, want 3", c.Len())
				}
				if c.Reserve("b", later.Add(time.Minute), later) {
					t.Fatal("kept key accepted again")
				}
				if !c.Reserve("c", later.Add(time.Minute), later) {
					t.Fatal("evicted key still refused")
				}
			},
		},
		{
			// Steady onboarding: expired signatures do not pile up until
			// max, the cache holds about what the window covers.
			name: "expired entries dropped as it grows, below max",
			max:  100_000,
			run: func(t *testing.T, c *Cache) {
				const window = time.Minute // 60 live entries at one per second
				for i := range 10_000 {
					at := now.Add(time.Duration(i) * time.Second)
					if !c.Reserve(fmt.Sprint("sig-", i), at.Add(window), at) {
						t.Fatalf("reservation %d refused", i)
					}
				}
				if n := c.Len(); n > 2*60+MinPrune {
					t.Fatalf("%d entries after 10,000 reservations with 60 unexpired, want at most %d", n, 2*60+MinPrune)
				}
				last := now.Add(9_999 * time.Second)
				if c.Reserve("sig-9990", last.Add(window), last) {
					t.Fatal("unexpired key dropped by the prune")
				}
			},
		},
		{
			name: "disabled",
			max:  0,
			run: func(t *testing.T, c *Cache) {
				c.Reserve("a", now.Add(time.Minute), now)
				if !c.Reserve("a", now.Add(time.Minute), now) {
					t.Fatal("disabled cache refused")
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.run(t, New(tt.max))
		})
	}
}
