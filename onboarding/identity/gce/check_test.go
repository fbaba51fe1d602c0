package gce_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/apicheck"
	"github.com/embark-mesh/embark/onboarding/identity/gce"
	"github.com/embark-mesh/embark/onboarding/identity/gce/gcetest"
	"github.com/embark-mesh/embark/onboarding/identity/jwt"
)

// checkFixture is a verifier confirming instances with a loopback Compute
// API, at a fixed time.
type checkFixture struct {
	*fixture
	compute *gcetest.ComputeAPI
	checker *gce.Checker
}

func newCheckFixture(t *testing.T, opts gce.CheckerOptions) *checkFixture {
	t.Helper()
	g, err := gcetest.NewGoogle()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	api := gcetest.NewComputeAPI()
	t.Cleanup(api.Close)
	f := &checkFixture{fixture: &fixture{google: g, now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}, compute: api}
	opts.Endpoint, opts.TokenSource = api.URL(), api.TokenSource()
	opts.Clock = func() time.Time { return f.now }
	if f.checker, err = gce.NewChecker(opts); err != nil {
		t.Fatal(err)
	}
	f.v, err = gce.NewVerifier(gce.Config{Audiences: []string{audience}, JWKSURL: g.JWKSURL(), CACertificates: g.CACertificates(),
		InstanceCheck: f.checker}, jwt.WithClock(func() time.Time { return f.now }))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *checkFixture) token(t *testing.T, in gcetest.Instance) string {
	t.Helper()
	return f.sign(t, in.Claims(audience, f.now.Add(-time.Minute)))
}

func TestInstanceCheckProvesTheAddress(t *testing.T) {
	f := newCheckFixture(t, gce.CheckerOptions{})
	in := gcetest.DefaultInstance()
	ci := gcetest.ComputeOf(in)
	ci.NetworkIPs = []string{"10.128.0.42", "192.168.7.7"} // nic0, nic1
	f.compute.Put(in.ProjectID, in.Zone, ci)
	id, err := f.v.Verify(t.Context(), f.token(t, in))
	if err != nil {
		t.Fatal(err)
	}
	if !id.GCE.InstanceConfirmed || id.GCE.Address != "10.128.0.42" {
		t.Fatalf("identity %+v, want confirmed with nic0's address 10.128.0.42", id.GCE)
	}
}

func TestVerifyWithoutInstanceCheckProvesNoAddress(t *testing.T) {
	f := newFixture(t)
	id, err := f.v.Verify(t.Context(), f.sign(t, gcetest.DefaultInstance().Claims(audience, f.now.Add(-time.Minute))))
	if err != nil {
		t.Fatal(err)
	}
	if id.GCE.InstanceConfirmed || id.GCE.Address != "" {
		t.Fatalf("identity %+v proves an address without the Compute API", id.GCE)
	}
}

// TestInstanceCheckRefusals is the table of what the Compute API's answer
// refuses, and of the answers that leave the check undecided (retryable).
func TestInstanceCheckRefusals(t *testing.T) {
	in := gcetest.DefaultInstance()
	tests := []struct {
		name       string
		setup      func(api *gcetest.ComputeAPI)
		wantReason identity.Reason
		wantMsg    string
	}{
		{name: "instance missing (404)", setup: func(*gcetest.ComputeAPI) {},
			wantReason: identity.ReasonInstanceNotRunning, wantMsg: "does not know instance ratings-1"},
		{name: "name now held by another instance", setup: func(api *gcetest.ComputeAPI) {
			ci := gcetest.ComputeOf(in)
			ci.ID = "7000000000000000001"
			api.Put(in.ProjectID, in.Zone, ci)
		}, wantReason: identity.ReasonInstanceReplaced, wantMsg: "with ID 7000000000000000001, the token's is 5180367924151823417"},
		{name: "stopping", setup: func(api *gcetest.ComputeAPI) {
			ci := gcetest.ComputeOf(in)
			ci.Status = "STOPPING"
			api.Put(in.ProjectID, in.Zone, ci)
		}, wantReason: identity.ReasonInstanceNotRunning, wantMsg: "STOPPING, not RUNNING"},
		{name: "terminated", setup: func(api *gcetest.ComputeAPI) {
			ci := gcetest.ComputeOf(in)
			ci.Status = "TERMINATED"
			api.Put(in.ProjectID, in.Zone, ci)
		}, wantReason: identity.ReasonInstanceNotRunning, wantMsg: "TERMINATED"},
		{name: "no network interface", setup: func(api *gcetest.ComputeAPI) {
			ci := gcetest.ComputeOf(in)
			ci.NetworkIPs = nil
			api.Put(in.ProjectID, in.Zone, ci)
		}, wantReason: identity.ReasonInstanceNoAddress, wantMsg: "networkIP of nic0"},
		{name: "API failing (500)", setup: func(api *gcetest.ComputeAPI) {
			api.PutInstance(in)
			api.Fail(http.StatusInternalServerError)
		}, wantReason: identity.ReasonInstanceCheckUnavailable, wantMsg: "answered 500"},
		{name: "permission denied (403)", setup: func(api *gcetest.ComputeAPI) {
			api.PutInstance(in)
			api.Fail(http.StatusForbidden)
		}, wantReason: identity.ReasonInstanceCheckUnavailable, wantMsg: "answered 403"},
		{name: "rate limited by Google (429)", setup: func(api *gcetest.ComputeAPI) {
			api.PutInstance(in)
			api.Fail(http.StatusTooManyRequests)
		}, wantReason: identity.ReasonInstanceCheckUnavailable, wantMsg: "answered 429"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCheckFixture(t, gce.CheckerOptions{})
			tt.setup(f.compute)
			id, err := f.v.Verify(t.Context(), f.token(t, in))
			if err == nil {
				t.Fatalf("accepted: %+v", id.GCE)
			}
			if !errors.Is(err, tt.wantReason) {
				t.Errorf("reason %q, want %q (%v)", identity.ReasonOf(err), tt.wantReason, err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not say %q", err, tt.wantMsg)
			}
		})
	}
}

// A token refused because the Compute API could not answer is not used up:
// the agent's retry with it succeeds once the API answers.
func TestInstanceCheckUnavailableKeepsTheToken(t *testing.T) {
	f := newCheckFixture(t, gce.CheckerOptions{})
	in := gcetest.DefaultInstance()
	f.compute.PutInstance(in)
	f.compute.Fail(http.StatusServiceUnavailable)
	tok := f.token(t, in)
	if _, err := f.v.Verify(t.Context(), tok); !errors.Is(err, identity.ReasonInstanceCheckUnavailable) {
		t.Fatalf("API down: %v, want InstanceCheckUnavailable", err)
	}
	f.compute.Fail(0)
	if _, err := f.v.Verify(t.Context(), tok); err != nil {
		t.Fatalf("the same token once the API answers: %v", err)
	}
}

func TestInstanceCheckCachesDescriptions(t *testing.T) {
	f := newCheckFixture(t, gce.CheckerOptions{Options: apicheck.Options{CacheTTL: time.Minute}})
	in := gcetest.DefaultInstance()
	f.compute.PutInstance(in)
	for i := range 2 {
		if _, err := f.v.Verify(t.Context(), f.token(t, in)); err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
		f.now = f.now.Add(time.Second) // a distinct token
	}
	if n := f.compute.Calls(); n != 1 {
		t.Fatalf("%d Compute API calls for two onboardings within the cache TTL, want 1", n)
	}
	// Deleted since: seen once the cached description expires.
	f.compute.Delete(in.ProjectID, in.Zone, in.InstanceName)
	f.now = f.now.Add(time.Minute)
	if _, err := f.v.Verify(t.Context(), f.token(t, in)); !errors.Is(err, identity.ReasonInstanceNotRunning) {
		t.Fatalf("after the TTL, instance deleted: %v, want InstanceNotRunning", err)
	}
	if n := f.compute.Calls(); n != 2 {
		t.Fatalf("%d Compute API calls, want 2", n)
	}
}

func TestInstanceCheckRateLimit(t *testing.T) {
	f := newCheckFixture(t, gce.CheckerOptions{Options: apicheck.Options{Rate: 1, Burst: 2}})
	for i := range 3 {
		in := gcetest.DefaultInstance()
		in.InstanceName = []string{"ratings-1", "ratings-2", "ratings-3"}[i]
		f.compute.PutInstance(in)
		_, err := f.v.Verify(t.Context(), f.token(t, in))
		switch {
		case i < 2 && err != nil:
			t.Fatalf("instance %d within the burst: %v", i, err)
		case i == 2 && (!errors.Is(err, identity.ReasonInstanceCheckUnavailable) || !errors.Is(err, gce.ErrRateLimited)):
			t.Fatalf("instance over the burst: %v, want InstanceCheckUnavailable (rate limited)", err)
		}
	}
	if n := f.compute.Calls(); n != 2 {
		t.Fatalf("%d Compute API calls, want 2 (the third is over the limit)", n)
	}
	f.now = f.now.Add(time.Second)
	in := gcetest.DefaultInstance()
	in.InstanceName = "ratings-3"
	if _, err := f.v.Verify(t.Context(), f.token(t, in)); err != nil {
		t.Fatalf("a second later: %v", err)
	}
}

// The gate is asked before the Compute API: an instance it refuses costs no
// call.
func TestInstanceCheckGateFirst(t *testing.T) {
	f := newCheckFixture(t, gce.CheckerOptions{})
	in := gcetest.DefaultInstance()
	f.compute.PutInstance(in)
	denied := errors.New("no policy allows project embark-test")
	var asked *identity.GCEIdentity
	_, err := f.v.VerifyGated(t.Context(), f.token(t, in), func(_ context.Context, claimed *identity.Identity) error {
		asked = claimed.GCE
		return denied
	})
	if !errors.Is(err, denied) {
		t.Fatalf("VerifyGated() = %v, want the gate's error", err)
	}
	if asked == nil || !asked.InstanceConfirmed || asked.InstanceID != in.InstanceID {
		t.Errorf("gate asked about %+v, want the token's instance as if confirmed", asked)
	}
	if n := f.compute.Calls(); n != 0 {
		t.Fatalf("%d Compute API calls for an instance the gate refused, want 0", n)
	}
}

// The checker gets its access token with Google's own service account key
// code (the JWT bearer flow against the key's token_uri) and sends it.
func TestCheckerWithServiceAccountKey(t *testing.T) {
	api := gcetest.NewComputeAPI()
	t.Cleanup(api.Close)
	key, err := api.ServiceAccountKey()
	if err != nil {
		t.Fatal(err)
	}
	ts, err := gce.CredentialsFromServiceAccountKey(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := gce.NewChecker(gce.CheckerOptions{Endpoint: api.URL(), TokenSource: ts})
	if err != nil {
		t.Fatal(err)
	}
	in := gcetest.DefaultInstance()
	api.PutInstance(in)
	got, err := c.Describe(t.Context(), in.ProjectID, in.Zone, in.InstanceName)
	if err != nil {
		t.Fatal(err)
	}
	if want := (gce.ComputeInstance{ID: in.InstanceID, Name: in.InstanceName, Status: "RUNNING", NetworkIP: in.IP}); *got != want {
		t.Fatalf("Describe() = %+v, want %+v", *got, want)
	}
	if api.TokensIssued() != 1 {
		t.Errorf("%d access tokens issued, want 1", api.TokensIssued())
	}
}

func TestParseInstance(t *testing.T) {
	tests := []struct {
		name, body string
		want       *gce.ComputeInstance
		wantErr    string
	}{
		{name: "string id, nic0 first", body: `{"id":"5180367924151823417","name":"ratings-1","status":"RUNNING","networkInterfaces":[{"name":"nic0","networkIP":"10.128.0.7"},{"name":"nic1","networkIP":"10.9.0.1"}]}`,
			want: &gce.ComputeInstance{ID: "5180367924151823417", Name: "ratings-1", Status: "RUNNING", NetworkIP: "10.128.0.7"}},
		{name: "numeric id, nic0 listed second", body: `{"id":42,"name":"a","status":"STAGING","networkInterfaces":[{"name":"nic1","networkIP":"10.9.0.1"},{"name":"nic0","networkIP":"10.128.0.8"}]}`,
			want: &gce.ComputeInstance{ID: "42", Name: "a", Status: "STAGING", NetworkIP: "10.128.0.8"}},
		{name: "no interface", body: `{"id":"1","name":"a","status":"RUNNING"}`,
			want: &gce.ComputeInstance{ID: "1", Name: "a", Status: "RUNNING"}},
		{name: "not JSON", body: `<html>`, wantErr: "instance resource"},
		{name: "no id", body: `{"name":"a","status":"RUNNING"}`, wantErr: "id"},
		{name: "id not numeric", body: `{"id":"12a","name":"a","status":"RUNNING"}`, wantErr: "id"},
		{name: "name not a name", body: `{"id":"1","name":"A/B","status":"RUNNING"}`, wantErr: "name"},
		{name: "no status", body: `{"id":"1","name":"a"}`, wantErr: "status"},
		{name: "networkIP not an address", body: `{"id":"1","name":"a","status":"RUNNING","networkInterfaces":[{"name":"nic0","networkIP":"10.0.0.300"}]}`, wantErr: "networkIP"},
		{name: "networkIP IPv6", body: `{"id":"1","name":"a","status":"RUNNING","networkInterfaces":[{"name":"nic0","networkIP":"2001:db8::1"}]}`, wantErr: "IPv4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := gce.ParseInstance([]byte(tt.body))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseInstance() = %+v, %v; want an error saying %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || *got != *tt.want {
				t.Fatalf("ParseInstance() = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestNewCheckerNeedsCredentialsAndURL(t *testing.T) {
	api := gcetest.NewComputeAPI()
	t.Cleanup(api.Close)
	if _, err := gce.NewChecker(gce.CheckerOptions{}); err == nil || !strings.Contains(err.Error(), "TokenSource") {
		t.Errorf("no token source: %v", err)
	}
	if _, err := gce.NewChecker(gce.CheckerOptions{TokenSource: api.TokenSource(), Endpoint: "ftp://x"}); err == nil || !strings.Contains(err.Error(), "http(s) URL") {
		t.Errorf("ftp endpoint: %v", err)
	}
}
