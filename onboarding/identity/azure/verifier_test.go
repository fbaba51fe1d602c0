package azure_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/azure"
	"github.com/embark-mesh/embark/onboarding/identity/azure/azuretest"
	"github.com/embark-mesh/embark/onboarding/identity/jwt"
	"github.com/embark-mesh/embark/onboarding/identity/jwt/jwttest"
)

const audience = "api://embark-onboarding"

// fixture is a loopback Microsoft and a verifier trusting the default VM's
// tenant through it, at a fixed time.
type fixture struct {
	ms  *azuretest.Microsoft
	now time.Time
	v   *azure.Verifier
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	m, err := azuretest.NewMicrosoft()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return newFixtureWith(t, m)
}

// newFixtureWith is a fresh verifier (empty replay cache) trusting m.
func newFixtureWith(t *testing.T, m *azuretest.Microsoft) *fixture {
	t.Helper()
	f := &fixture{ms: m, now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	var err error
	f.v, err = azure.NewVerifier(azure.Config{
		Tenants: []string{azuretest.DefaultVM().TenantID}, Audiences: []string{audience},
		JWKSURL: m.JWKSURL(), CACertificates: m.CACertificates(),
	}, jwt.WithClock(func() time.Time { return f.now }))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) sign(t *testing.T, claims map[string]any) string {
	t.Helper()
	tok, err := f.ms.Sign(claims)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestVerifyAcceptsManagedIdentityToken(t *testing.T) {
	vm := azuretest.DefaultVM()
	for _, tt := range []struct {
		name string
		edit func(c map[string]any)
	}{
		{"v1 token", func(map[string]any) {}},
		{"v2 token", func(c map[string]any) {
			c["iss"], c["ver"] = "https://login.microsoftonline.com/"+vm.TenantID+"/v2.0", "2.0"
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			c := vm.Claims(audience, f.now.Add(-time.Hour))
			tt.edit(c)
			id, err := f.v.Verify(t.Context(), f.sign(t, c))
			if err != nil {
				t.Fatal(err)
			}
			want := identity.AzureIdentity{
				TenantID: vm.TenantID, SubscriptionID: vm.SubscriptionID, ResourceGroup: "embark-rg", VMName: "ratings-1",
				PrincipalID: vm.PrincipalID, ResourceID: vm.ResourceID(), Expiry: f.now.Add(23 * time.Hour),
			}
			if id.Method != identity.MethodAzureManagedIdentityToken || id.Azure == nil || *id.Azure != want {
				t.Fatalf("identity %+v (%s), want %+v", id.Azure, id.Method, want)
			}
			if id.AWS != nil || id.JWT != nil || id.GCE != nil {
				t.Error("identity sets another platform too")
			}
		})
	}
}

// TestVerifyRefusesForgeries is the forgery table: every token is refused
// with the reason named.
func TestVerifyRefusesForgeries(t *testing.T) {
	vm := azuretest.DefaultVM()
	const otherTenant = "f8cdef31-a31e-4b4a-93e4-5f571e91255a"
	tests := []jwttest.Forgery[*fixture]{
		{
			Name: "wrong signer, Microsoft's kid",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				return jwttest.Forged(t, f.ms.KeyID(), c)
			},
			WantReason: identity.ReasonBadSignature, WantMsg: "does not verify",
		},
		{
			Name: "wrong audience (Azure Resource Manager's)",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["aud"] = "https://management.azure.com/"
				return f.sign(t, c)
			},
			WantReason: identity.ReasonWrongAudience, WantMsg: "audience",
		},
		{
			Name: "issuer of a tenant that is not allowed",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["iss"], c["tid"] = "https://sts.windows.net/"+otherTenant+"/", otherTenant
				return f.sign(t, c)
			},
			WantReason: identity.ReasonUnknownIssuer, WantMsg: "issuer",
		},
		{
			Name: "issuer without the trailing slash",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["iss"] = "https://sts.windows.net/" + vm.TenantID
				return f.sign(t, c)
			},
			WantReason: identity.ReasonUnknownIssuer, WantMsg: "issuer",
		},
		{
			Name: "tid of another tenant under an allowed issuer",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["tid"] = otherTenant
				return f.sign(t, c)
			},
			WantReason: identity.ReasonMalformed, WantMsg: "tid",
		},
		{
			Name: "expired",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["iat"], c["nbf"], c["exp"] = f.now.Add(-26*time.Hour).Unix(), f.now.Add(-26*time.Hour).Unix(), f.now.Add(-2*time.Hour).Unix()
				return f.sign(t, c)
			},
			WantReason: identity.ReasonExpired, WantMsg: "expired",
		},
		{
			Name: "not yet valid",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["iat"], c["nbf"], c["exp"] = f.now.Add(10*time.Minute).Unix(), f.now.Add(10*time.Minute).Unix(), f.now.Add(10*time.Hour).Unix()
				return f.sign(t, c)
			},
			WantReason: identity.ReasonNotYetValid, WantMsg: "not valid before",
		},
		{
			Name: "lifetime longer than 25 hours",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["exp"] = f.now.Add(30 * 24 * time.Hour).Unix()
				return f.sign(t, c)
			},
			WantReason: identity.ReasonLifetimeTooLong, WantMsg: "maxTokenLifetime",
		},
		{
			Name: "replayed",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				return jwttest.Used(t, f.v, f.sign(t, c))
			},
			WantReason: identity.ReasonReplayed, WantMsg: "already used",
		},
		{
			Name: "subscription edited after signing",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				tok := f.sign(t, c)
				other := vm
				other.SubscriptionID = "11111111-2222-3333-4444-555555555555"
				c["xms_mirid"] = other.ResourceID()
				forged := f.sign(t, c)
				parts, forgedParts := strings.Split(tok, "."), strings.Split(forged, ".")
				return parts[0] + "." + forgedParts[1] + "." + parts[2]
			},
			WantReason: identity.ReasonBadSignature, WantMsg: "does not verify",
		},
		{
			Name: "no xms_mirid",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				delete(c, "xms_mirid")
				return f.sign(t, c)
			},
			WantReason: identity.ReasonMalformed, WantMsg: "xms_mirid",
		},
		{
			Name: "xms_mirid of a user-assigned identity",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["xms_mirid"] = "/subscriptions/" + vm.SubscriptionID + "/resourcegroups/embark-rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/shared"
				return f.sign(t, c)
			},
			WantReason: identity.ReasonMalformed, WantMsg: "virtual machine",
		},
		{
			Name: "xms_mirid with an extra segment",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["xms_mirid"] = vm.ResourceID() + "/extensions/x"
				return f.sign(t, c)
			},
			WantReason: identity.ReasonMalformed, WantMsg: "xms_mirid",
		},
		{
			Name: "xms_mirid with a subscription that is not a GUID",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				c["xms_mirid"] = "/subscriptions/../resourcegroups/embark-rg/providers/Microsoft.Compute/virtualMachines/ratings-1"
				return f.sign(t, c)
			},
			WantReason: identity.ReasonMalformed, WantMsg: "GUID",
		},
		{
			Name: "no tid",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				delete(c, "tid")
				return f.sign(t, c)
			},
			WantReason: identity.ReasonMalformed, WantMsg: "tid",
		},
		{
			Name: "no oid",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				delete(c, "oid")
				return f.sign(t, c)
			},
			WantReason: identity.ReasonMalformed, WantMsg: "oid",
		},
		{
			Name: "no iat",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				delete(c, "iat")
				c["exp"] = f.now.Add(time.Hour).Unix()
				return f.sign(t, c)
			},
			WantReason: identity.ReasonMalformed, WantMsg: "iat",
		},
		{
			Name: "unsigned",
			Token: func(t *testing.T, f *fixture, c map[string]any) string {
				return jwttest.Unsigned(f.sign(t, c))
			},
			WantReason: identity.ReasonDisallowedAlgorithm, WantMsg: "unsigned",
		},
	}
	jwttest.RefuseForgeries(t, tests, func(t *testing.T) (*fixture, jwttest.TokenVerifier, map[string]any) {
		f := newFixture(t)
		return f, f.v, vm.Claims(audience, f.now.Add(-time.Hour))
	})
}

// TestEachTokenOnce: two tokens of one VM each onboard once.
func TestEachTokenOnce(t *testing.T) {
	f := newFixture(t)
	vm := azuretest.DefaultVM()
	jwttest.EachTokenOnce(t, f.v, f.sign(t, vm.Claims(audience, f.now.Add(-time.Minute))), f.sign(t, vm.Claims(audience, f.now.Add(-2*time.Minute))))
}

func TestNewVerifierRefusesBadConfig(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  azure.Config
		want string
	}{
		{"no tenant", azure.Config{Audiences: []string{audience}}, "tenant"},
		{"no audience", azure.Config{Tenants: []string{azuretest.DefaultVM().TenantID}}, "audience"},
		{"tenant not a GUID", azure.Config{Tenants: []string{"contoso.onmicrosoft.com"}, Audiences: []string{audience}}, "GUID"},
		{"tenant twice", azure.Config{Tenants: []string{azuretest.DefaultVM().TenantID, strings.ToUpper(azuretest.DefaultVM().TenantID)}, Audiences: []string{audience}}, "twice"},
		{"plain http keys", azure.Config{Tenants: []string{azuretest.DefaultVM().TenantID}, Audiences: []string{audience}, JWKSURL: "http://keys.example/{tenant}"}, "https"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := azure.NewVerifier(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewVerifier() = %v, want an error saying %q", err, tt.want)
			}
		})
	}
}

func TestIMDSIssuesManagedIdentityTokens(t *testing.T) {
	f := newFixture(t)
	f.now = time.Now()
	imds := azuretest.NewIMDS(f.ms, azuretest.DefaultVM())
	t.Cleanup(imds.Close)
	get := func(metadata, query string) (int, []byte) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, imds.URL()+"/metadata/identity/oauth2/token"+query, nil)
		if err != nil {
			t.Fatal(err)
		}
		if metadata != "" {
			req.Header.Set("Metadata", metadata)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		return resp.StatusCode, b
	}
	q := "?api-version=2018-02-01&resource=" + audience
	if code, _ := get("", q); code != http.StatusBadRequest {
		t.Errorf("without Metadata: true: %d, want 400", code)
	}
	code, body := get("true", q)
	if code != http.StatusOK {
		t.Fatalf("token: %d %s", code, body)
	}
	var out struct {
		AccessToken string `json:"access_token"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatal(err)
	}
	if _, err := f.v.Verify(t.Context(), out.AccessToken); err != nil {
		t.Fatalf("the metadata service's token: %v", err)
	}
	_, body = get("true", "?api-version=2018-02-01&resource=https://management.azure.com/")
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatal(err)
	}
	if _, err := f.v.Verify(t.Context(), out.AccessToken); !errors.Is(err, identity.ReasonWrongAudience) {
		t.Fatalf("a token for Resource Manager: %v, want WrongAudience", err)
	}
}

// TestKeysFetchedCachedAndRefreshed: the tenant's keys are fetched when
// first needed and cached; a token of a key Microsoft rotated in is
// verified after one more fetch, and the next token of that key costs none.
func TestKeysFetchedCachedAndRefreshed(t *testing.T) {
	f := newFixture(t)
	vm := azuretest.DefaultVM()
	if _, err := f.v.Verify(t.Context(), f.sign(t, vm.Claims(audience, f.now.Add(-time.Hour)))); err != nil {
		t.Fatal(err)
	}
	if _, err := f.v.Verify(t.Context(), f.sign(t, vm.Claims(audience, f.now.Add(-2*time.Hour)))); err != nil {
		t.Fatal(err)
	}
	if n := f.ms.Fetches(); n != 1 {
		t.Fatalf("%d key fetches for two tokens of one key, want 1", n)
	}
	if err := f.ms.RotateKey(); err != nil {
		t.Fatal(err)
	}
	f.now = f.now.Add(time.Minute)
	if _, err := f.v.Verify(t.Context(), f.sign(t, vm.Claims(audience, f.now.Add(-time.Hour)))); err != nil {
		t.Fatalf("token of the rotated-in key: %v", err)
	}
	if _, err := f.v.Verify(t.Context(), f.sign(t, vm.Claims(audience, f.now.Add(-2*time.Hour)))); err != nil {
		t.Fatal(err)
	}
	if n := f.ms.Fetches(); n != 2 {
		t.Fatalf("%d key fetches after a rotation, want 2", n)
	}
}
