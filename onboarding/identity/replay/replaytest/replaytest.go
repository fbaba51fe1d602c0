// Package replaytest holds an in-memory replay.Shared for the tests of the
// verifiers that use one (aws, jwt, gce): two verifiers given the same
// store behave as two replicas of one deployment.
package replaytest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity/replay"
)

// Shared is a replay.Shared in memory that fails while it is down and
// counts what it is asked to record. It is safe for concurrent use.
type Shared struct {
	mu       sync.Mutex
	used     map[string]bool
	down     bool
	reserves int
}

var _ replay.Shared = (*Shared)(nil)

// NewShared returns an empty store, down (failing every Reserve with
// replay.ErrUnavailable) when down is set.
func NewShared(down bool) *Shared {
	return &Shared{used: map[string]bool{}, down: down}
}

// Reserve implements replay.Shared.
func (s *Shared) Reserve(_ context.Context, key string, _ time.Time) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reserves++
	if s.down {
		return false, fmt.Errorf("%w: down", replay.ErrUnavailable)
	}
	if s.used[key] {
		return false, nil
	}
	s.used[key] = true
	return true, nil
}

// SetDown sets whether the store fails, and returns how many Reserve calls
// it has had.
func (s *Shared) SetDown(down bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
	return s.reserves
}
