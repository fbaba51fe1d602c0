package tokenauth

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// TestReviewCacheSweepDropsExpiredReviews: reviews that may no longer be
// reused are dropped by the sweep (not only when looked up again), and the
// sweep stops rescheduling itself once none is left.
func TestReviewCacheSweepDropsExpiredReviews(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	a := New(Options{Audience: "aud", CacheTTL: time.Hour, CacheSize: 16, Clock: func() time.Time { return now }})
	a.store([32]byte{1}, &Credential{SecretUID: types.UID("a"), expires: now.Add(time.Hour)})
	a.store([32]byte{2}, &Credential{SecretUID: types.UID("b"), expires: now.Add(2 * time.Hour)})
	if !a.sweeping {
		t.Fatal("storing a review scheduled no sweep")
	}

	now = now.Add(time.Hour)
	a.sweep()
	if got := a.lru.Len(); got != 1 || len(a.index) != 1 || a.cached([32]byte{2}) == nil {
		t.Fatalf("after the first review expired: %d reviews, want only the second", got)
	}
	if !a.sweeping {
		t.Fatal("the sweep stopped while a review was left")
	}

	now = now.Add(time.Hour)
	a.sweep()
	if got := a.lru.Len(); got != 0 || len(a.index) != 0 {
		t.Fatalf("after every review expired: %d reviews, want none", got)
	}
	if a.sweeping {
		t.Fatal("the sweep still runs with no review left")
	}
}
