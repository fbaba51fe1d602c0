package azure

import (
	"strings"
	"testing"
)

// FuzzParseVMResourceID feeds arbitrary strings to ParseVMResourceID: it
// refuses them or returns parts of a virtual machine's resource ID in their
// formats, in lower case, whose canonical form parses to the same parts;
// it never panics.
func FuzzParseVMResourceID(f *testing.F) {
	f.Add("/subscriptions/0b1f6471-1bf0-4dda-aec3-cb9272f09590/resourcegroups/Embark-RG/providers/Microsoft.Compute/virtualMachines/ratings-1")
	f.Add("/subscriptions/0b1f6471-1bf0-4dda-aec3-cb9272f09590/resourcegroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/id")
	f.Add("")
	f.Add("////////")
	f.Add("/subscriptions/x/resourcegroups/(a)/providers/microsoft.compute/virtualmachines/_")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseVMResourceID(s)
		if err != nil {
			return
		}
		if !guidRE.MatchString(got.SubscriptionID) || !resourceGroupRE.MatchString(got.ResourceGroup) || !vmNameRE.MatchString(got.Name) {
			t.Fatalf("accepted malformed parts of %q: %+v", s, got)
		}
		if got.SubscriptionID != strings.ToLower(got.SubscriptionID) || got.ResourceGroup != strings.ToLower(got.ResourceGroup) || got.Name != strings.ToLower(got.Name) {
			t.Fatalf("parts of %q not in lower case: %+v", s, got)
		}
		again, err := ParseVMResourceID(got.String())
		if err != nil || again != got {
			t.Fatalf("canonical form %q of %q parses to %+v, %v", got.String(), s, again, err)
		}
	})
}

// FuzzParseIdentity feeds arbitrary claim values to parseIdentity: it
// refuses or returns an identity whose tenant is the issuer's and whose
// every field has its format; it never panics.
func FuzzParseIdentity(f *testing.F) {
	const tenant = "72f988bf-86f1-41af-91ab-2d7cd011db47"
	f.Add(tenant, "9b5a7f2e-3c1d-4e8f-a6b2-0d4c8e1f7a93", "/subscriptions/0b1f6471-1bf0-4dda-aec3-cb9272f09590/resourcegroups/rg/providers/Microsoft.Compute/virtualMachines/vm", "1700000000")
	f.Add("", "", "", "")
	f.Add(strings.ToUpper(tenant), "x", "/", "-1")
	f.Fuzz(func(t *testing.T, tid, oid, mirid, iat string) {
		got, err := parseIdentity(tenant, map[string]string{attrTenant: tid, attrObjectID: oid, attrMIRID: mirid, attrIssuedAt: iat})
		if err != nil {
			return
		}
		if got.TenantID != tenant || !guidRE.MatchString(got.PrincipalID) || !guidRE.MatchString(got.SubscriptionID) ||
			!resourceGroupRE.MatchString(got.ResourceGroup) || !vmNameRE.MatchString(got.VMName) || got.ResourceID != mirid {
			t.Fatalf("accepted malformed claims: %+v", got)
		}
	})
}

// FuzzParseARM feeds arbitrary Resource Manager answers to the VM and
// network interface parsers and the token answer parser: they refuse or
// return values in their formats; they never panic.
func FuzzParseARM(f *testing.F) {
	f.Add([]byte(`{"location":"westeurope","identity":{"principalId":"9b5a7f2e-3c1d-4e8f-a6b2-0d4c8e1f7a93"},"properties":{"vmId":"13f56399-bd52-4150-9748-7190aae1ff21","provisioningState":"Succeeded","networkProfile":{"networkInterfaces":[{"id":"/subscriptions/0b1f6471-1bf0-4dda-aec3-cb9272f09590/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/n","properties":{"primary":true}}]}}}`))
	f.Add([]byte(`{"properties":{"ipConfigurations":[{"properties":{"primary":true,"privateIPAddress":"10.1.0.4"}}]}}`))
	f.Add([]byte(`{"access_token":"x","expires_in":"3600"}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"properties":{"networkProfile":{"networkInterfaces":[{"id":"/../x"}]}}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		if vm, err := ParseARMVM(body); err == nil {
			if !locationRE.MatchString(vm.Location) || !guidRE.MatchString(vm.VMID) || (vm.PrincipalID != "" && !guidRE.MatchString(vm.PrincipalID)) ||
				(vm.PrimaryNIC != "" && !nicIDRE.MatchString(vm.PrimaryNIC)) {
				t.Fatalf("accepted a malformed VM description: %+v", vm)
			}
		}
		if a, err := ParseARMNICAddress(body); err == nil && !a.Is4() {
			t.Fatalf("accepted a primary address that is not IPv4: %v", a)
		}
		if tok, life, err := ParseTokenAnswer(body); err == nil && (tok == "" || life <= 0) {
			t.Fatalf("accepted a token answer without a token or lifetime: %q %v", tok, life)
		}
	})
}
