package xds

import (
	"context"
	"testing"
)

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
