package endpoint

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/registry"
)

// WatchRegistration implements OnboardingService. It sends the caller's
// registration's current state, then DELETED once the registration is gone
// or replaced (another UID), and ends. It looks at the registration every
// Options.WatchInterval in Options.Client, the endpoint's informer cache, so
// a watching agent costs no API-server request. The stream ends with
// UNAUTHENTICATED when the onboarding token expires.
func (s *Server) WatchRegistration(_ *onboardingv1alpha1.WatchRegistrationRequest, stream grpc.ServerStreamingServer[onboardingv1alpha1.RegistrationEvent]) error {
	ctx := stream.Context()
	claims, err := s.session(ctx)
	if err != nil {
		return err
	}
	key := types.NamespacedName{Namespace: claims.Namespace(), Name: claims.Name()}
	ctx, cancel := context.WithDeadline(ctx, claims.Expiry)
	defer cancel()

	uid, err := s.registrationUID(ctx, key, *claims.Workload.Verified)
	if err != nil {
		return err
	}
	event := func(state onboardingv1alpha1.RegistrationEvent_State, uid types.UID) *onboardingv1alpha1.RegistrationEvent {
		return &onboardingv1alpha1.RegistrationEvent{State: state, Namespace: key.Namespace, RegistrationName: key.Name, Uid: string(uid)}
	}
	if uid == "" {
		return stream.Send(event(onboardingv1alpha1.RegistrationEvent_DELETED, ""))
	}
	if err := stream.Send(event(onboardingv1alpha1.RegistrationEvent_PRESENT, uid)); err != nil {
		return err
	}
	tick := time.NewTicker(s.opts.WatchInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded && stream.Context().Err() == nil {
				return status.Error(codes.Unauthenticated, "onboarding token expired: watch again with a renewed token")
			}
			return status.FromContextError(ctx.Err()).Err()
		case <-tick.C:
		}
		cur, err := s.registrationUID(ctx, key, *claims.Workload.Verified)
		if err != nil {
			if ctx.Err() != nil || status.Code(err) == codes.Unavailable {
				continue // ending, or a cache read error: look again next tick
			}
			return err
		}
		if cur != uid {
			s.log.Info("registration deleted; told its agent", "registration", key.String())
			return stream.Send(event(onboardingv1alpha1.RegistrationEvent_DELETED, uid))
		}
	}
}

// registrationUID returns the UID of the registration key ("" when it does
// not exist), refusing a registration of another workload.
func (s *Server) registrationUID(ctx context.Context, key types.NamespacedName, workload runtimev1alpha1.WorkloadIdentity) (types.UID, error) {
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := s.opts.Client.Get(ctx, client.ObjectKey(key), war); err != nil {
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		if ctx.Err() != nil {
			return "", status.FromContextError(ctx.Err()).Err()
		}
		return "", status.Errorf(codes.Unavailable, "read registration %s: %v", key, err)
	}
	if !war.DeletionTimestamp.IsZero() {
		return "", nil
	}
	if !registry.SameWorkload(war.Spec.Identity, workload) {
		return "", status.Errorf(codes.PermissionDenied, "registration %s belongs to another workload", key)
	}
	return war.UID, nil
}
