package registry

import (
	"reflect"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/fixtures"
)

// The agent's version and last error reach status.agent on the Register
// that creates the registration and on each that reuses it; a Register that
// reports the same writes nothing, and one that reports no error clears it.
func TestRegisterRecordsTheAgentReport(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	wg := createGroup(t, ns)
	clock := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r, err := NewRegistrar(Options{Client: env.Client, Cache: cached, Recorder: recorder, Logger: fixtures.Logger(t), Clock: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}
	reg := fixtures.Registration("172.31.5.254")
	reg.Agent.Version = "v1.4.0"
	denied := &runtimev1alpha1.AgentError{Reason: "PermissionDenied", Message: "not authorized to onboard (request id 0123456789abcdef)"}
	req := Request{Group: wg, Identity: fixtures.AWSIdentity(fixtures.InstanceID), Registration: reg, AgentError: denied}
	stored := func() *runtimev1alpha1.AgentStatus {
		t.Helper()
		war := &runtimev1alpha1.WorkloadAutoRegistration{}
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: seedName}, war)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return war.Status.Agent
	}

	for _, step := range []struct {
		name    string
		version string
		last    *runtimev1alpha1.AgentError
		at      time.Time
		want    *runtimev1alpha1.AgentStatus
		rewrite bool
	}{
		{name: "created", version: "v1.4.0", last: denied, at: clock,
			want: &runtimev1alpha1.AgentStatus{Version: "v1.4.0", LastError: denied}, rewrite: true},
		{name: "same report", version: "v1.4.0", last: denied, at: clock.Add(time.Hour),
			want: &runtimev1alpha1.AgentStatus{Version: "v1.4.0", LastError: denied}},
		{name: "upgraded, no error", version: "v1.5.0", at: clock.Add(2 * time.Hour),
			want: &runtimev1alpha1.AgentStatus{Version: "v1.5.0"}, rewrite: true},
	} {
		before := time.Time{}
		if s := stored(); s != nil && s.ReportedAt != nil {
			before = s.ReportedAt.Time
		}
		clock = step.at
		req.Registration.Agent.Version, req.AgentError = step.version, step.last
		res, err := r.Write(ctx, req)
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		got := stored()
		if got == nil || got.ReportedAt == nil {
			t.Fatalf("%s: status.agent = %+v, want a report with its time", step.name, got)
		}
		wantAt := before
		if step.rewrite {
			wantAt = step.at
		}
		if !got.ReportedAt.Time.Equal(wantAt) {
			t.Errorf("%s: reportedAt %v, want %v", step.name, got.ReportedAt.Time, wantAt)
		}
		if got.Version != step.want.Version || !reflect.DeepEqual(got.LastError, step.want.LastError) {
			t.Errorf("%s: status.agent = version %q, last error %+v; want %q, %+v", step.name, got.Version, got.LastError, step.want.Version, step.want.LastError)
		}
		if !reflect.DeepEqual(res.Registration.Status.Agent, got) {
			t.Errorf("%s: result holds status.agent %+v, stored %+v", step.name, res.Registration.Status.Agent, got)
		}
	}
}
