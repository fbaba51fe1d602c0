package azure

import (
	"fmt"
	"regexp"
	"strings"
)

// Formats of the parts of a VM's resource ID, as Azure defines them.
var (
	guidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	// Resource group names: 1 to 90 letters, digits, '_', '-', '.', '(' and
	// ')', not ending in '.'. Only ASCII is accepted here.
	resourceGroupRE = regexp.MustCompile(`^[-A-Za-z0-9_.()]{0,89}[-A-Za-z0-9_()]$`)
	// VM names: 1 to 64 letters, digits, '_', '-' and '.', starting and
	// ending with a letter, digit or '_'.
	vmNameRE = regexp.MustCompile(`^[A-Za-z0-9_]([-A-Za-z0-9_.]{0,62}[A-Za-z0-9_])?$`)
)

// maxResourceIDLength bounds a resource ID read from a token.
const maxResourceIDLength = 512

// VMResourceID is the resource ID of an Azure virtual machine, lower-cased
// (Azure compares these names without case).
type VMResourceID struct {
	SubscriptionID string
	ResourceGroup  string
	Name           string
}

// String is the resource ID in its canonical form.
func (r VMResourceID) String() string {
	return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachines/%s", r.SubscriptionID, r.ResourceGroup, r.Name)
}

// ParseVMResourceID parses
// /subscriptions/<guid>/resourceGroups/<group>/providers/Microsoft.Compute/virtualMachines/<name>
// (segment names in any case, as xms_mirid spells them). Anything else is
// refused, notably a user-assigned identity's
// .../Microsoft.ManagedIdentity/userAssignedIdentities/<name>, which names
// an identity any number of VMs may hold, not a VM.
func ParseVMResourceID(s string) (VMResourceID, error) {
	if len(s) > maxResourceIDLength {
		return VMResourceID{}, fmt.Errorf("resource ID is %d characters long, at most %d", len(s), maxResourceIDLength)
	}
	parts := strings.Split(s, "/")
	if len(parts) != 9 || parts[0] != "" {
		return VMResourceID{}, fmt.Errorf("resource ID %q is not /subscriptions/<id>/resourceGroups/<group>/providers/Microsoft.Compute/virtualMachines/<name>", clip(s))
	}
	for i, want := range map[int]string{1: "subscriptions", 3: "resourcegroups", 5: "providers", 6: "microsoft.compute", 7: "virtualmachines"} {
		if !strings.EqualFold(parts[i], want) {
			return VMResourceID{}, fmt.Errorf("resource ID %q: segment %d is %q, want %s (the token must be the system-assigned identity of a virtual machine)", clip(s), i, clip(parts[i]), want)
		}
	}
	sub, group, name := parts[2], parts[4], parts[8]
	switch {
	case !guidRE.MatchString(sub):
		return VMResourceID{}, fmt.Errorf("resource ID %q: subscription %q is not a GUID", clip(s), clip(sub))
	case !resourceGroupRE.MatchString(group):
		return VMResourceID{}, fmt.Errorf("resource ID %q: resource group %q is not a resource group name", clip(s), clip(group))
	case !vmNameRE.MatchString(name):
		return VMResourceID{}, fmt.Errorf("resource ID %q: virtual machine name %q is not a VM name", clip(s), clip(name))
	}
	return VMResourceID{SubscriptionID: strings.ToLower(sub), ResourceGroup: strings.ToLower(group), Name: strings.ToLower(name)}, nil
}

func clip(s string) string {
	if len(s) <= 100 {
		return s
	}
	return s[:100] + "..."
}
