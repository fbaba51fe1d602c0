package aws_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity"
	awsid "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/replay"
)

// memShared is a replay.Shared in memory that fails while down is set and
// counts what it is asked to record.
type memShared struct {
	mu       sync.Mutex
	used     map[string]bool
	down     bool
	reserves int
}

func (m *memShared) Reserve(_ context.Context, key string, _ time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reserves++
	if m.down {
		return false, fmt.Errorf("%w: down", replay.ErrUnavailable)
	}
	if m.used[key] {
		return false, nil
	}
	m.used[key] = true
	return true, nil
}

func (m *memShared) set(down bool) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.down = down
	return m.reserves
}

// Two verifiers (two replicas) sharing a store accept a signed STS request
// once between them. A store that cannot answer refuses nothing for good,
// and a request STS refuses is never recorded.
func TestSharedSTSReplay(t *testing.T) {
	f := newSTSFixture(t)
	shared := &memShared{used: map[string]bool{}, down: true}
	a, b := f.verifier(t, awsid.WithSharedReplay(shared)), f.verifier(t, awsid.WithSharedReplay(shared))
	cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)

	_, err := a.Verify(t.Context(), cred)
	if !errors.Is(err, replay.ErrUnavailable) || identity.ReasonOf(err) != "" {
		t.Fatalf("store down: Verify() = %v, want replay.ErrUnavailable and no refusal reason", err)
	}
	shared.set(false)
	if _, err := a.Verify(t.Context(), cred); err != nil {
		t.Fatalf("the same request once the store answers, at the same replica: %v", err)
	}
	if _, err := b.Verify(t.Context(), cred); identity.ReasonOf(err) != identity.ReasonSTSReplayed {
		t.Fatalf("the request at the other replica: Verify() = %v, want %s", err, identity.ReasonSTSReplayed)
	}

	rejected := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
	f.env.STS.Revoke(f.roleCredentials(t).AccessKeyID)
	before := shared.set(false)
	c := f.verifier(t, awsid.WithSharedReplay(shared)) // a third replica: nothing in its own cache
	if _, err := c.Verify(t.Context(), rejected); !errors.Is(err, identity.ReasonSTSRejected) {
		t.Fatalf("a request STS refuses: Verify() = %v, want %s", err, identity.ReasonSTSRejected)
	}
	if after := shared.set(false); after != before {
		t.Errorf("a request STS refused was recorded in the shared store (%d reservations, want %d)", after, before)
	}
}
