package replay

import (
	"context"
	"errors"
	"time"
)

// Shared records used credentials for every replica of a deployment, so
// that a credential accepted by one replica is refused by all the others.
// A verifier consults its own Cache first (a replay at the same replica
// costs no API call) and the Shared store last, once the credential has
// proven everything else: only proven credentials cost a shared write.
type Shared interface {
	// Reserve records key until expiry and reports whether it was new (or
	// had expired). An error, which wraps ErrUnavailable, means the store
	// could not tell: the credential must not be accepted.
	Reserve(ctx context.Context, key string, expiry time.Time) (bool, error)
}

// ErrUnavailable is wrapped by every error of a Shared store that could not
// tell whether a credential was used: the agent retries later.
var ErrUnavailable = errors.New("the deployment's record of used credentials is unavailable")
