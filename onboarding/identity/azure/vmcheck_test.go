package azure_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/apicheck"
	"github.com/embark-mesh/embark/onboarding/identity/azure"
	"github.com/embark-mesh/embark/onboarding/identity/azure/azuretest"
	"github.com/embark-mesh/embark/onboarding/identity/jwt"
)

// checkFixture is a verifier with the VM check against a loopback Resource
// Manager knowing the default VM, its own token from the loopback IMDS.
type checkFixture struct {
	*fixture
	arm *azuretest.ARM
}

func newCheckFixture(t *testing.T, opts azure.CheckerOptions) *checkFixture {
	t.Helper()
	f := newFixture(t)
	arm := azuretest.NewARM()
	t.Cleanup(arm.Close)
	arm.AddVM(azuretest.DefaultVM())
	if opts.Token == nil {
		src, err := azure.NewTokenSource(azure.TokenSourceOptions{Getenv: func(string) string { return "" }, IMDSEndpoint: arm.URL()})
		if err != nil {
			t.Fatal(err)
		}
		opts.Token = src
	}
	opts.ARMEndpoint = arm.URL()
	opts.Clock = func() time.Time { return f.now }
	checker, err := azure.NewChecker(opts)
	if err != nil {
		t.Fatal(err)
	}
	f.v, err = azure.NewVerifier(azure.Config{
		Tenants: []string{azuretest.DefaultVM().TenantID}, Audiences: []string{audience},
		JWKSURL: f.ms.JWKSURL(), CACertificates: f.ms.CACertificates(), VMCheck: checker,
	}, jwt.WithClock(func() time.Time { return f.now }))
	if err != nil {
		t.Fatal(err)
	}
	return &checkFixture{fixture: f, arm: arm}
}

func (f *checkFixture) token(t *testing.T, vm azuretest.VM) string {
	t.Helper()
	return f.sign(t, vm.Claims(audience, f.now.Add(-time.Minute)))
}

// A VM Resource Manager confirms has its location, VM ID and primary
// private address in its identity.
func TestVMCheckConfirms(t *testing.T) {
	f := newCheckFixture(t, azure.CheckerOptions{})
	vm := azuretest.DefaultVM()
	id, err := f.v.Verify(t.Context(), f.token(t, vm))
	if err != nil {
		t.Fatal(err)
	}
	if a := id.Azure; !a.VMConfirmed || a.Location != "westeurope" || a.VMID != vm.VMID || a.Address != vm.IP || a.VMName != vm.Name {
		t.Fatalf("identity %+v, want VM %s confirmed in westeurope with VM ID %s and address %s", a, vm.Name, vm.VMID, vm.IP)
	}
	if n := f.arm.Calls(); n != 2 {
		t.Errorf("%d Resource Manager calls, want 2 (the VM and its network interface)", n)
	}
}

// TestVMCheckRefuses is the table of what Resource Manager reports against
// the token: each is refused with its reason, and the token is not used up
// (once the VM is as the token says, the same token is accepted).
func TestVMCheckRefuses(t *testing.T) {
	vm := azuretest.DefaultVM()
	for _, tt := range []struct {
		name       string
		arrange    func(a *azuretest.ARM)
		wantReason identity.Reason
		wantMsg    string
	}{
		{"VM unknown (404)", func(a *azuretest.ARM) { a.RemoveVM(vm) }, identity.ReasonVMNotFound, "does not know VM"},
		{"VM of another principal (created again under the name)", func(a *azuretest.ARM) {
			a.EditVM(vm, func(d map[string]any) {
				d["identity"].(map[string]any)["principalId"] = "0f7d3a3e-1111-4c4c-9c9c-5e5e5e5e5e5e"
			})
		}, identity.ReasonVMMismatch, "0f7d3a3e-1111-4c4c-9c9c-5e5e5e5e5e5e"},
		{"VM without a system-assigned identity", func(a *azuretest.ARM) {
			a.EditVM(vm, func(d map[string]any) { delete(d, "identity") })
		}, identity.ReasonVMMismatch, "system-assigned identity"},
		{"VM not provisioned", func(a *azuretest.ARM) {
			a.EditVM(vm, func(d map[string]any) { d["properties"].(map[string]any)["provisioningState"] = "Deleting" })
		}, identity.ReasonVMNotFound, `"Deleting"`},
		{"network interface missing", func(a *azuretest.ARM) { a.RemoveNIC(vm) }, identity.ReasonVMMismatch, "network interface"},
		{"VM without network interfaces", func(a *azuretest.ARM) {
			a.EditVM(vm, func(d map[string]any) {
				d["properties"].(map[string]any)["networkProfile"] = map[string]any{}
			})
		}, identity.ReasonVMMismatch, "primary network interface"},
		{"Resource Manager failing (500)", func(a *azuretest.ARM) { a.SetStatus(http.StatusInternalServerError) }, identity.ReasonVMCheckUnavailable, "HTTP 500"},
		{"endpoint not allowed to read the VM (403)", func(a *azuretest.ARM) { a.SetStatus(http.StatusForbidden) }, identity.ReasonVMCheckUnavailable, "HTTP 403"},
		{"Resource Manager answering something else", func(a *azuretest.ARM) {
			a.EditVM(vm, func(d map[string]any) { d["location"] = "West Europe!" })
		}, identity.ReasonVMCheckUnavailable, "location"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newCheckFixture(t, azure.CheckerOptions{})
			tt.arrange(f.arm)
			tok := f.token(t, vm)
			id, err := f.v.Verify(t.Context(), tok)
			if err == nil {
				t.Fatalf("accepted: %+v", id.Azure)
			}
			if identity.ReasonOf(err) != tt.wantReason || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("Verify() = %v; want %s saying %q", err, tt.wantReason, tt.wantMsg)
			}
			// The VM as the token says: the refused token was not used up.
			f.arm.SetStatus(0)
			f.arm.AddVM(vm)
			f.now = f.now.Add(time.Minute) // past the cache of nothing
			if _, err := f.v.Verify(t.Context(), tok); err != nil {
				t.Fatalf("the refused token once the VM is as it says: %v", err)
			}
		})
	}
}

// A VM described once is not asked about again within the cache TTL; after
// it, it is (a VM deleted since is seen).
func TestVMCheckCaches(t *testing.T) {
	f := newCheckFixture(t, azure.CheckerOptions{Options: apicheck.Options{CacheTTL: time.Minute}})
	vm := azuretest.DefaultVM()
	for i := range 2 {
		if _, err := f.v.Verify(t.Context(), f.sign(t, vm.Claims(audience, f.now.Add(-time.Duration(i+1)*time.Minute)))); err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
	}
	if n := f.arm.Calls(); n != 2 {
		t.Fatalf("%d Resource Manager calls for two tokens of one VM, want 2 (one description)", n)
	}
	if n := f.arm.TokensIssued(); n != 1 {
		t.Errorf("the endpoint fetched %d tokens of its own, want 1 (cached)", n)
	}
	f.now = f.now.Add(2 * time.Minute)
	f.arm.RemoveVM(vm)
	if _, err := f.v.Verify(t.Context(), f.token(t, vm)); identity.ReasonOf(err) != identity.ReasonVMNotFound {
		t.Fatalf("after the cache TTL, a deleted VM: %v, want %s", err, identity.ReasonVMNotFound)
	}
}

// Over the rate limit the check is unavailable (the agent retries), and no
// call is made.
func TestVMCheckRateLimited(t *testing.T) {
	f := newCheckFixture(t, azure.CheckerOptions{Options: apicheck.Options{Rate: 0.001, Burst: 3}})
	vm := azuretest.DefaultVM()
	other := vm
	other.Name, other.PrincipalID, other.IP = "ratings-2", "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f", "10.1.0.5"
	f.arm.AddVM(other)
	if _, err := f.v.Verify(t.Context(), f.token(t, vm)); err != nil {
		t.Fatal(err)
	}
	_, err := f.v.Verify(t.Context(), f.token(t, other))
	if identity.ReasonOf(err) != identity.ReasonVMCheckUnavailable || !errors.Is(err, azure.ErrRateLimited) {
		t.Fatalf("a second VM over the rate limit: %v, want %s (rate limited)", err, identity.ReasonVMCheckUnavailable)
	}
	if n := f.arm.Calls(); n != 3 {
		t.Errorf("%d Resource Manager calls, want 3 (two for the first VM, one within the burst)", n)
	}
}

// A gate refusing the token's identity stops the verification before
// Resource Manager is asked; the gate sees the identity unconfirmed.
func TestVMCheckGateBeforeResourceManager(t *testing.T) {
	f := newCheckFixture(t, azure.CheckerOptions{})
	denied := errors.New("no policy admits this VM")
	var seen *identity.AzureIdentity
	_, err := f.v.VerifyGated(t.Context(), f.token(t, azuretest.DefaultVM()), nil, func(_ context.Context, id *identity.Identity) error {
		seen = id.Azure
		return denied
	})
	if !errors.Is(err, denied) {
		t.Fatalf("VerifyGated() = %v, want the gate's refusal", err)
	}
	if seen == nil || seen.VMConfirmed || seen.Location != "" || seen.VMName != "ratings-1" {
		t.Errorf("gate saw %+v, want the unconfirmed VM ratings-1", seen)
	}
	if n := f.arm.Calls(); n != 0 {
		t.Errorf("%d Resource Manager calls after the gate refused, want 0", n)
	}
}

// With AKS workload identity the endpoint exchanges its federated token
// file for a Resource Manager token at Entra ID, once while it is valid.
func TestVMCheckWorkloadIdentity(t *testing.T) {
	arm := azuretest.NewARM()
	t.Cleanup(arm.Close)
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("projected-service-account-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"AZURE_FEDERATED_TOKEN_FILE": file, "AZURE_CLIENT_ID": "5a2b1c3d-0000-4000-8000-000000000002",
		"AZURE_TENANT_ID": azuretest.DefaultVM().TenantID, "AZURE_AUTHORITY_HOST": arm.URL() + "/",
	}
	src, err := azure.NewTokenSource(azure.TokenSourceOptions{Getenv: func(k string) string { return env[k] }, IMDSEndpoint: "http://192.0.2.1"})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		tok, err := src.Token(t.Context())
		if err != nil || tok != azuretest.ARMToken {
			t.Fatalf("Token() = %q, %v; want the Resource Manager token", tok, err)
		}
	}
	if n := arm.TokensIssued(); n != 1 {
		t.Errorf("%d tokens fetched, want 1 (cached)", n)
	}
	delete(env, "AZURE_TENANT_ID")
	if _, err := azure.NewTokenSource(azure.TokenSourceOptions{Getenv: func(k string) string { return env[k] }}); err == nil || !strings.Contains(err.Error(), "AZURE_TENANT_ID") {
		t.Errorf("workload identity without AZURE_TENANT_ID: %v, want an error naming it", err)
	}
}

func TestNewCheckerRequiresToken(t *testing.T) {
	if _, err := azure.NewChecker(azure.CheckerOptions{}); err == nil || !strings.Contains(err.Error(), "token source") {
		t.Fatalf("NewChecker() = %v, want an error naming the token source", err)
	}
}

// The endpoint's own IMDS token is reused until five minutes before it
// expires, then fetched again.
func TestTokenSourceRefreshesNearExpiry(t *testing.T) {
	arm := azuretest.NewARM()
	t.Cleanup(arm.Close)
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	src, err := azure.NewTokenSource(azure.TokenSourceOptions{Getenv: func(string) string { return "" }, IMDSEndpoint: arm.URL(), Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	get := func() {
		t.Helper()
		if tok, err := src.Token(t.Context()); err != nil || tok != azuretest.ARMToken {
			t.Fatalf("Token() = %q, %v", tok, err)
		}
	}
	get()
	now = now.Add(24*time.Hour - 6*time.Minute) // the IMDS token lives 86399s
	get()
	if n := arm.TokensIssued(); n != 1 {
		t.Fatalf("%d tokens fetched before the token's last five minutes, want 1", n)
	}
	now = now.Add(2 * time.Minute)
	get()
	if n := arm.TokensIssued(); n != 2 {
		t.Fatalf("%d tokens fetched in the token's last five minutes, want 2", n)
	}
}
