package kubestore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/ptr"

	"github.com/embark-mesh/embark/onboarding/identity/replay"
	"github.com/embark-mesh/embark/registry/write"
)

const (
	// LabelUsedCredential marks the Leases of used credentials (value
	// "true"); Collect lists them by it.
	LabelUsedCredential = "onboarding.tetrate.io/used-credential"
	// annotationReservation holds a random value per reservation, so that
	// a create retried after a lost answer is recognised as this
	// reservation's own and not taken for a replay.
	annotationReservation = "onboarding.tetrate.io/reservation"
	// namePrefix starts the name of every used-credential Lease.
	namePrefix = "embark-used-"
	// DefaultCollectInterval is how often Run deletes expired Leases.
	DefaultCollectInterval = time.Minute
	// maxAttempts bounds the create, read, delete rounds of one Reserve
	// (a Lease expired or collected between two of them).
	maxAttempts = 3
)

// Options configure a Store. Leases, Namespace and Replica are required.
type Options struct {
	// Leases is the client of coordination.k8s.io/v1 Leases.
	Leases coordinationv1client.LeasesGetter
	// Namespace holds the Leases: the endpoint's own namespace.
	Namespace string
	// Replica names this replica in the Leases it creates.
	Replica string
	// Writer is the replica's write budget. Default: a Writer of its own
	// with the default budget.
	Writer *write.Writer
	// CollectInterval is how often Run deletes expired Leases. Default
	// DefaultCollectInterval.
	CollectInterval time.Duration
	// Clock is the store's clock. Default: time.Now.
	Clock func() time.Time
	// Logger. Default: discard.
	Logger *slog.Logger
}

// Store is the replay.Shared store on the API server. It is safe for
// concurrent use.
type Store struct {
	opts   Options
	leases coordinationv1client.LeaseInterface
}

var _ replay.Shared = (*Store)(nil)

// New returns a Store of o.
func New(o Options) (*Store, error) {
	if o.Leases == nil || o.Namespace == "" || o.Replica == "" {
		return nil, errors.New("used-credential store: Leases, Namespace and Replica are required")
	}
	o.Writer = write.OrDefault(o.Writer)
	if o.CollectInterval <= 0 {
		o.CollectInterval = DefaultCollectInterval
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Store{opts: o, leases: o.Leases.Leases(o.Namespace)}, nil
}

// Name is the name of the Lease of the credential key.
func Name(key string) string {
	sum := sha256.Sum256([]byte(key))
	return namePrefix + hex.EncodeToString(sum[:])
}

// Reserve implements replay.Shared: it creates the key's Lease, and reports
// a Lease that exists and has not expired as a replay. An expired Lease is
// replaced.
func (s *Store) Reserve(ctx context.Context, key string, expiry time.Time) (bool, error) {
	name, nonce := Name(key), rand.Text()
	for range maxAttempts {
		now := s.opts.Clock()
		err := s.opts.Writer.Do(ctx, func(ctx context.Context) error {
			_, err := s.leases.Create(ctx, s.lease(name, nonce, now, expiry), metav1.CreateOptions{})
			return err
		})
		if err == nil {
			return true, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return false, unavailable(name, err)
		}
		held, err := s.leases.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue // collected since the create: create it again
		case err != nil:
			return false, unavailable(name, err)
		case held.Annotations[annotationReservation] == nonce:
			return true, nil // this reservation's create, answered AlreadyExists when retried
		case expiryOf(held).After(now):
			return false, nil
		}
		if err := s.delete(ctx, held); err != nil {
			return false, unavailable(name, err)
		}
	}
	return false, unavailable(name, fmt.Errorf("the Lease was replaced by another replica %d times", maxAttempts))
}

// lease is the Lease recording name from now until expiry.
func (s *Store) lease(name, nonce string, now, expiry time.Time) *coordinationv1.Lease {
	secs := int32(min(max(math.Ceil(expiry.Sub(now).Seconds()), 1), math.MaxInt32))
	at := metav1.NewMicroTime(now)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: s.opts.Namespace,
			Labels:      map[string]string{LabelUsedCredential: "true"},
			Annotations: map[string]string{annotationReservation: nonce},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(s.opts.Replica), LeaseDurationSeconds: &secs,
			AcquireTime: &at, RenewTime: &at,
		},
	}
}

// expiryOf is when the credential of l stops mattering: its renewTime plus
// leaseDurationSeconds (zero, so expired, when either is missing).
func expiryOf(l *coordinationv1.Lease) time.Time {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return time.Time{}
	}
	return l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
}

// delete deletes l if it is still the Lease read (its UID and
// resourceVersion); a Lease already gone or replaced is no error.
func (s *Store) delete(ctx context.Context, l *coordinationv1.Lease) error {
	err := s.opts.Writer.Do(ctx, func(ctx context.Context) error {
		return s.leases.Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &l.UID, ResourceVersion: &l.ResourceVersion}})
	})
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return fmt.Errorf("delete expired Lease %s: %w", l.Name, err)
}

// Collect deletes the used-credential Leases that have expired and returns
// how many it deleted.
func (s *Store) Collect(ctx context.Context) (int, error) {
	list, err := s.leases.List(ctx, metav1.ListOptions{LabelSelector: LabelUsedCredential + "=true"})
	if err != nil {
		return 0, fmt.Errorf("list used-credential Leases: %w", err)
	}
	now, deleted := s.opts.Clock(), 0
	for i := range list.Items {
		l := &list.Items[i]
		if expiryOf(l).After(now) {
			continue
		}
		if err := s.delete(ctx, l); err != nil {
			return deleted, err
		}
		deleted++
	}
	return deleted, nil
}

// Run collects expired Leases every CollectInterval until ctx ends.
func (s *Store) Run(ctx context.Context) {
	t := time.NewTicker(s.opts.CollectInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := s.Collect(ctx)
		if err != nil && ctx.Err() == nil {
			s.opts.Logger.Warn("delete expired used-credential Leases", "deleted", n, "error", err)
			continue
		}
		if n > 0 {
			s.opts.Logger.Debug("deleted expired used-credential Leases", "deleted", n)
		}
	}
}

// unavailable wraps err, about the Lease name, as replay.ErrUnavailable.
func unavailable(name string, err error) error {
	return fmt.Errorf("%w: Lease %s: %w", replay.ErrUnavailable, name, err)
}
