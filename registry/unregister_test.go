package registry

import (
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/fixtures"
)

func TestUnregisterDeletesOnlyForTheHoldingSession(t *testing.T) {
	const key = "session-key-of-the-agent"
	id := fixtures.AWSIdentity(fixtures.InstanceID)
	other := fixtures.AWSIdentity("i-0fedcba9876543210")
	tests := []struct {
		name        string
		id          runtimev1alpha1.WorkloadIdentity
		session     string
		wantErr     error
		wantDeleted bool
	}{
		{name: "the holding session", id: id, session: key, wantDeleted: true},
		{name: "no session key", id: id, session: "", wantErr: ErrWrongSession},
		{name: "another session key", id: id, session: "another", wantErr: ErrWrongSession},
		{name: "another workload's claims", id: other, session: key, wantErr: ErrOtherWorkload},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			ns := env.Namespace(t)
			r := newRegistrar(t, nil)
			res, err := r.Write(ctx, Request{Group: createGroup(t, ns), Identity: id, Registration: fixtures.Registration("172.31.5.254"), SessionHash: SessionHash(key)})
			if err != nil {
				t.Fatal(err)
			}
			name := types.NamespacedName{Namespace: ns, Name: res.Registration.Name}
			deleted, err := r.Unregister(ctx, name, tt.id, tt.session)
			if !errors.Is(err, tt.wantErr) || deleted != tt.wantDeleted {
				t.Fatalf("Unregister = %v, %v; want %v, %v", deleted, err, tt.wantDeleted, tt.wantErr)
			}
			getErr := env.Client.Get(ctx, name, &runtimev1alpha1.WorkloadAutoRegistration{})
			if gone := apierrors.IsNotFound(getErr); gone != tt.wantDeleted {
				t.Fatalf("registration gone = %v (%v), want %v", gone, getErr, tt.wantDeleted)
			}
			if !tt.wantDeleted {
				return
			}
			// Gone already: nothing to delete, no error.
			if deleted, err := r.Unregister(ctx, name, tt.id, tt.session); deleted || err != nil {
				t.Fatalf("Unregister of a deleted registration = %v, %v; want false, nil", deleted, err)
			}
		})
	}
}

// A registration created again under the name by another agent session is
// not deleted by the session that held the old one.
func TestUnregisterLeavesARegistrationCreatedAgain(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	r := newRegistrar(t, nil)
	id := fixtures.AWSIdentity(fixtures.InstanceID)
	wg := createGroup(t, ns)
	req := Request{Group: wg, Identity: id, Registration: fixtures.Registration("172.31.5.254"), SessionHash: SessionHash("old")}
	res, err := r.Write(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	name := client.ObjectKeyFromObject(res.Registration)
	if deleted, err := r.Unregister(ctx, name, id, "old"); !deleted || err != nil {
		t.Fatalf("Unregister = %v, %v", deleted, err)
	}
	waitNothingLeft(t, ns)
	req.SessionHash = SessionHash("new")
	if _, err := r.Write(ctx, req); err != nil {
		t.Fatal(err)
	}
	if deleted, err := r.Unregister(ctx, name, id, "old"); deleted || !errors.Is(err, ErrWrongSession) {
		t.Fatalf("old session's Unregister = %v, %v; want false, ErrWrongSession", deleted, err)
	}
	if err := env.Client.Get(ctx, name, &runtimev1alpha1.WorkloadAutoRegistration{}); err != nil {
		t.Fatalf("the new registration: %v", err)
	}
}
