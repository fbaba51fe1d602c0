package registry

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/fixtures"
)

// apiCalls counts the API writes (stored) and TokenRequests (not stored)
// made through a client, and can fail status updates.
type apiCalls struct {
	writes, tokens, statusUpdates atomic.Int64
	// failStatus, when set, answers the n-th status update (from 1) with
	// its error instead of making it.
	failStatus func(n int64) error
}

func (a *apiCalls) client(c client.WithWatch) client.WithWatch {
	return interceptor.NewClient(c, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			a.writes.Add(1)
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			a.writes.Add(1)
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			a.writes.Add(1)
			return c.Patch(ctx, obj, p, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			a.writes.Add(1)
			return c.Delete(ctx, obj, opts...)
		},
		SubResourceCreate: func(ctx context.Context, c client.Client, sub string, obj, subObj client.Object, opts ...client.SubResourceCreateOption) error {
			if sub == "token" {
				a.tokens.Add(1)
			} else {
				a.writes.Add(1)
			}
			return c.SubResource(sub).Create(ctx, obj, subObj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			n := a.statusUpdates.Add(1)
			if a.failStatus != nil {
				if err := a.failStatus(n); err != nil {
					return err
				}
			}
			a.writes.Add(1)
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			a.writes.Add(1)
			return c.SubResource(sub).Patch(ctx, obj, p, opts...)
		},
	})
}

// statusRequest is a new workload whose registration gets a status: its
// agent reports a version, and its network has no gateway in a mesh of two
// networks (NetworkTopology False).
func statusRequest(t *testing.T) (Request, string) {
	t.Helper()
	ns := env.Namespace(t)
	wg := fixtures.SeedGroup(ns)
	wg.Spec.Template.Network = "virtual-machines"
	fixtures.CreateGroup(t.Context(), t, env.Client, wg)
	reg := fixtures.Registration("10.0.0.5")
	reg.Agent.Version = "1.2.3"
	return Request{Group: wg, Identity: fixtures.AWSIdentity(fixtures.InstanceID), Registration: reg}, ns
}

func statusRegistrar(t *testing.T, c client.Client) *Registrar {
	t.Helper()
	r, err := NewRegistrar(Options{Client: c, Cache: cached, Recorder: recorder, Logger: fixtures.Logger(t), Topology: twoNetworks})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// checkStatus fails unless the stored registration key holds the agent's
// version and the NetworkTopology condition.
func checkStatus(t *testing.T, key client.ObjectKey) {
	t.Helper()
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), key, war); err != nil {
		t.Fatal(err)
	}
	if war.Status.Agent == nil || war.Status.Agent.Version != "1.2.3" {
		t.Errorf("status.agent = %+v, want version 1.2.3", war.Status.Agent)
	}
	if cond := networkTopology(t, key); cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != ReasonNoNetworkGateway {
		t.Errorf("NetworkTopology condition %+v, want False/%s", cond, ReasonNoNetworkGateway)
	}
}

// A new registration's status (the NetworkTopology condition and the
// agent's report) is one write, made while the dependents are written: a
// Register of a new workload costs the registration, its WorkloadEntry, its
// Secret and that status update (and one TokenRequest), not a status
// update each.
func TestNewRegistrationWritesItsStatusOnce(t *testing.T) {
	req, ns := statusRequest(t)
	calls := &apiCalls{}
	res, err := statusRegistrar(t, calls.client(env.Client)).Write(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if w, tr := calls.writes.Load(), calls.tokens.Load(); w != 4 || tr != 1 {
		t.Errorf("%d writes and %d TokenRequests, want 4 (registration, WorkloadEntry, Secret, status) and 1", w, tr)
	}
	key := client.ObjectKeyFromObject(res.Registration)
	checkStatus(t, key)
	if res.Registration.Status.Agent == nil || res.Registration.Status.Agent.Version != "1.2.3" {
		t.Errorf("the result's status.agent = %+v, want the stored one", res.Registration.Status.Agent)
	}
	fixtures.WaitEvent(t, env.Client, ns, key.Name, ReasonNoNetworkGateway, `network "virtual-machines" has no gateway`)
}

// The status is written while the dependents are: when a dependent cannot
// be written, the new registration is removed with everything it owns,
// after the status write ended.
func TestNewStatusBesideAFailedDependentLeavesNothing(t *testing.T) {
	req, ns := statusRequest(t)
	failing := interceptor.NewClient(env.Client, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*corev1.Secret); ok {
				return apierrors.NewForbidden(corev1.Resource("secrets"), obj.GetName(), errors.New("injected failure"))
			}
			return c.Create(ctx, obj, opts...)
		},
	})
	calls := &apiCalls{}
	_, err := statusRegistrar(t, calls.client(failing)).Write(t.Context(), req)
	if err == nil || !strings.Contains(err.Error(), "injected failure") {
		t.Fatalf("err = %v, want the injected failure", err)
	}
	if calls.statusUpdates.Load() != 1 {
		t.Errorf("%d status updates, want the new registration's one, made beside the failed Secret", calls.statusUpdates.Load())
	}
	waitNothingLeft(t, ns)
}

// A failed status write fails nothing (the status only reports), and the
// next Register writes it; a conflict (the registration changed since it
// was created) writes it from the stored registration.
func TestNewStatusFailureIsRepaired(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{name: "refused", err: apierrors.NewForbidden(runtimev1alpha1.Resource("workloadautoregistrations"), "x", errors.New("injected failure"))},
		{name: "conflict", err: apierrors.NewConflict(runtimev1alpha1.Resource("workloadautoregistrations"), "x", errors.New("injected conflict"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			req, _ := statusRequest(t)
			calls := &apiCalls{failStatus: func(n int64) error {
				if n == 1 {
					return tc.err
				}
				return nil
			}}
			r := statusRegistrar(t, calls.client(env.Client))
			res, err := r.Write(ctx, req)
			if err != nil {
				t.Fatalf("Write with a failed status write: %v", err)
			}
			key := client.ObjectKeyFromObject(res.Registration)
			if err := env.Client.Get(ctx, key, &runtimev1alpha1.WorkloadAutoRegistration{}); err != nil {
				t.Fatalf("registration: %v", err)
			}
			if res.WorkloadEntry == nil || res.SidecarToken == nil {
				t.Fatalf("result %+v lacks the WorkloadEntry or the token", res)
			}
			if tc.name == "refused" {
				war := &runtimev1alpha1.WorkloadAutoRegistration{}
				if err := env.Client.Get(ctx, key, war); err != nil {
					t.Fatal(err)
				}
				if war.Status.Agent != nil {
					t.Fatalf("status.agent %+v written although its write was refused", war.Status.Agent)
				}
				fixtures.WaitCached(t, cached, res.WorkloadEntry)
				if _, err := r.Write(ctx, req); err != nil {
					t.Fatalf("Write again: %v", err)
				}
			}
			checkStatus(t, key)
		})
	}
}
