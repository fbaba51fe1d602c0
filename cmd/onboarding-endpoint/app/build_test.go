package app

import (
	"testing"

	"github.com/embark-mesh/embark/registry/write"
)

// The client-side rate limit derived from the write budget never throttles
// below it: each write of the budget may take requestsPerWrite requests,
// and client-go's default (5 QPS, burst 10) is never what remains.
func TestClientRateLimitFollowsTheWriteBudget(t *testing.T) {
	tests := []struct {
		name      string
		budget    write.Options
		wantQPS   float32
		wantBurst int
	}{
		{"default budget", write.Options{}, float32(3 * write.DefaultQPS), 3 * write.DefaultBurst},
		{"a lowered budget", write.Options{QPS: 20, Burst: 40}, 60, 120},
		{"a raised budget", write.Options{QPS: 2000, Burst: 4000}, 6000, 12000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			qps, burst := clientRateLimit(write.New(tt.budget).Options())
			if qps != tt.wantQPS || burst != tt.wantBurst {
				t.Errorf("clientRateLimit = %v QPS, burst %d; want %v, %d", qps, burst, tt.wantQPS, tt.wantBurst)
			}
		})
	}
}
