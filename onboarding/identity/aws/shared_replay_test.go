package aws_test

import (
	"errors"
	"testing"

	"github.com/embark-mesh/embark/onboarding/identity"
	awsid "github.com/embark-mesh/embark/onboarding/identity/aws"
	"github.com/embark-mesh/embark/onboarding/identity/replay"
	"github.com/embark-mesh/embark/onboarding/identity/replay/replaytest"
)

// Two verifiers (two replicas) sharing a store accept a signed STS request
// once between them. A store that cannot answer refuses nothing for good,
// and a request STS refuses is never recorded.
func TestSharedSTSReplay(t *testing.T) {
	f := newSTSFixture(t)
	shared := replaytest.NewShared(true)
	a, b := f.verifier(t, awsid.WithSharedReplay(shared)), f.verifier(t, awsid.WithSharedReplay(shared))
	cred := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)

	_, err := a.Verify(t.Context(), cred)
	if !errors.Is(err, replay.ErrUnavailable) || identity.ReasonOf(err) != "" {
		t.Fatalf("store down: Verify() = %v, want replay.ErrUnavailable and no refusal reason", err)
	}
	shared.SetDown(false)
	if _, err := a.Verify(t.Context(), cred); err != nil {
		t.Fatalf("the same request once the store answers, at the same replica: %v", err)
	}
	if _, err := b.Verify(t.Context(), cred); identity.ReasonOf(err) != identity.ReasonSTSReplayed {
		t.Fatalf("the request at the other replica: Verify() = %v, want %s", err, identity.ReasonSTSReplayed)
	}

	rejected := credentialFrom(t, f.env.IMDS, f.env.STS.URL, audience)
	f.env.STS.Revoke(f.roleCredentials(t).AccessKeyID)
	before := shared.SetDown(false)
	c := f.verifier(t, awsid.WithSharedReplay(shared)) // a third replica: nothing in its own cache
	if _, err := c.Verify(t.Context(), rejected); !errors.Is(err, identity.ReasonSTSRejected) {
		t.Fatalf("a request STS refuses: Verify() = %v, want %s", err, identity.ReasonSTSRejected)
	}
	if after := shared.SetDown(false); after != before {
		t.Errorf("a request STS refused was recorded in the shared store (%d reservations, want %d)", after, before)
	}
}
