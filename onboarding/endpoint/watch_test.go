package endpoint

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
	"github.com/embark-mesh/embark/test/fixtures"
)

func TestWatchRegistrationReportsDeletion(t *testing.T) {
	ctx := t.Context()
	h := ratingsHarness(t, narrowPolicy)
	auth, err := h.authorize("ratings", h.aws.IMDS)
	if err != nil {
		t.Fatal(err)
	}
	authed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+auth.GetToken())

	// Before registering: DELETED at once, and the stream ends.
	first, err := h.client.WatchRegistration(authed, &onboardingv1alpha1.WatchRegistrationRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := first.Recv()
	if err != nil || ev.GetState() != onboardingv1alpha1.RegistrationEvent_DELETED {
		t.Fatalf("before registering: %v, %v; want DELETED", ev, err)
	}

	reg, err := h.register(auth.GetToken(), "172.31.5.254")
	if err != nil {
		t.Fatal(err)
	}
	if reg.GetRegistrationUid() == "" {
		t.Fatal("Register returned no registration UID")
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: h.ns, Name: reg.GetRegistrationName()}, war); err != nil {
		t.Fatal(err)
	}
	fixtures.WaitCached(t, cached, war)
	stream, err := h.client.WatchRegistration(authed, &onboardingv1alpha1.WatchRegistrationRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ev, err = stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if ev.GetState() != onboardingv1alpha1.RegistrationEvent_PRESENT || ev.GetUid() != reg.GetRegistrationUid() || ev.GetRegistrationName() != reg.GetRegistrationName() {
		t.Fatalf("first event %v, want PRESENT with uid %s", ev, reg.GetRegistrationUid())
	}

	// kubectl delete war
	if err := env.Client.Delete(ctx, war); err != nil {
		t.Fatal(err)
	}
	ev, err = stream.Recv()
	if err != nil || ev.GetState() != onboardingv1alpha1.RegistrationEvent_DELETED {
		t.Fatalf("after delete: %v, %v; want DELETED", ev, err)
	}
	if _, err := stream.Recv(); err == nil {
		t.Error("the stream went on after DELETED")
	}
}

func TestWatchRegistrationNeedsAToken(t *testing.T) {
	h := newHarness(t)
	stream, err := h.client.WatchRegistration(t.Context(), &onboardingv1alpha1.WatchRegistrationRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.Unauthenticated {
		t.Errorf("without a token: %v, want Unauthenticated", err)
	}
}
