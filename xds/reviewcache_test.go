package xds

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// TestReviewCacheSweepDropsExpiredReviews: reviews that may no longer be
// reused are dropped by the sweep (not only when looked up again), and the
// sweep stops rescheduling itself once none is left.
func TestReviewCacheSweepDropsExpiredReviews(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	a := newAuthenticator(nil, "aud", time.Hour, 16, func() time.Time { return now })
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

// TestEmptyConfigSharesOneSnapshot: every proxy of EmptyConfig is served the
// same snapshot, its version map already built.
func TestEmptyConfigSharesOneSnapshot(t *testing.T) {
	a, err := EmptyConfig{}.Snapshot(context.Background(), &Proxy{NodeID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := EmptyConfig{}.Snapshot(context.Background(), &Proxy{NodeID: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatal("two proxies got two empty snapshots")
	}
	if a.GetVersionMap("type.googleapis.com/envoy.config.cluster.v3.Cluster") == nil {
		t.Fatal("the shared snapshot's version map is not built")
	}
}
