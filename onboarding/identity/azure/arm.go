package azure

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
)

// ARMVM is what Azure Resource Manager reports of a virtual machine
// (GET .../Microsoft.Compute/virtualMachines/<name>) that the VM check
// uses.
type ARMVM struct {
	// PrincipalID is identity.principalId: the object ID of the VM's
	// system-assigned managed identity, "" when it has none.
	PrincipalID string
	// Location is the VM's region, in lower case.
	Location string
	// VMID is properties.vmId.
	VMID string
	// ProvisioningState is properties.provisioningState.
	ProvisioningState string
	// PrimaryNIC is the resource ID of the primary network interface
	// (properties.networkProfile.networkInterfaces[].properties.primary,
	// or the only one), "" when there is none.
	PrimaryNIC string
}

// maxARMBody bounds an ARM answer read by the check.
const maxARMBody = 1 << 20

var (
	// locationRE is an Azure region's name as ARM writes it (westeurope,
	// eastus2euap).
	locationRE = regexp.MustCompile(`^[a-z0-9]{1,64}$`)
	// nicIDRE is a network interface's resource ID.
	nicIDRE = regexp.MustCompile(`(?i)^/subscriptions/[0-9a-f-]{36}/resourceGroups/[-a-z0-9_.()]{1,90}/providers/Microsoft\.Network/networkInterfaces/[-a-z0-9_.]{1,80}$`)
)

// ParseARMVM parses ARM's answer for a virtual machine. It refuses
// anything that is not a VM description with the fields the check needs in
// their formats.
func ParseARMVM(body []byte) (*ARMVM, error) {
	var doc struct {
		Location string `json:"location"`
		Identity *struct {
			Type        string `json:"type"`
			PrincipalID string `json:"principalId"`
		} `json:"identity"`
		Properties struct {
			VMID              string `json:"vmId"`
			ProvisioningState string `json:"provisioningState"`
			NetworkProfile    struct {
				NetworkInterfaces []struct {
					ID         string `json:"id"`
					Properties *struct {
						Primary bool `json:"primary"`
					} `json:"properties"`
				} `json:"networkInterfaces"`
			} `json:"networkProfile"`
		} `json:"properties"`
	}
	if len(body) > maxARMBody {
		return nil, fmt.Errorf("virtual machine description is %d bytes, at most %d", len(body), maxARMBody)
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("virtual machine description: %w", err)
	}
	vm := &ARMVM{Location: strings.ToLower(doc.Location), ProvisioningState: doc.Properties.ProvisioningState}
	if !locationRE.MatchString(vm.Location) {
		return nil, fmt.Errorf("virtual machine description: location %q is not a region name", clip(doc.Location))
	}
	if !guidRE.MatchString(doc.Properties.VMID) {
		return nil, fmt.Errorf("virtual machine description: properties.vmId %q is not a GUID", clip(doc.Properties.VMID))
	}
	vm.VMID = strings.ToLower(doc.Properties.VMID)
	if len(vm.ProvisioningState) > 64 {
		return nil, errors.New("virtual machine description: properties.provisioningState is too long")
	}
	if id := doc.Identity; id != nil && id.PrincipalID != "" {
		if !guidRE.MatchString(id.PrincipalID) {
			return nil, fmt.Errorf("virtual machine description: identity.principalId %q is not a GUID", clip(id.PrincipalID))
		}
		vm.PrincipalID = strings.ToLower(id.PrincipalID)
	}
	nics := doc.Properties.NetworkProfile.NetworkInterfaces
	for _, n := range nics {
		if len(nics) == 1 || (n.Properties != nil && n.Properties.Primary) {
			if !nicIDRE.MatchString(n.ID) {
				return nil, fmt.Errorf("virtual machine description: network interface ID %q is not a network interface's resource ID", clip(n.ID))
			}
			vm.PrimaryNIC = n.ID
			break
		}
	}
	return vm, nil
}

// ParseARMNICAddress parses ARM's answer for a network interface and
// returns the private IPv4 address of its primary IP configuration
// (ipConfigurations[].properties.primary, or the only one).
func ParseARMNICAddress(body []byte) (netip.Addr, error) {
	var doc struct {
		Properties struct {
			IPConfigurations []struct {
				Properties struct {
					Primary          bool   `json:"primary"`
					PrivateIPAddress string `json:"privateIPAddress"`
				} `json:"properties"`
			} `json:"ipConfigurations"`
		} `json:"properties"`
	}
	if len(body) > maxARMBody {
		return netip.Addr{}, fmt.Errorf("network interface description is %d bytes, at most %d", len(body), maxARMBody)
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return netip.Addr{}, fmt.Errorf("network interface description: %w", err)
	}
	cfgs := doc.Properties.IPConfigurations
	for _, c := range cfgs {
		if len(cfgs) != 1 && !c.Properties.Primary {
			continue
		}
		a, err := netip.ParseAddr(c.Properties.PrivateIPAddress)
		if err != nil || !a.Is4() {
			return netip.Addr{}, fmt.Errorf("network interface description: primary privateIPAddress %q is not an IPv4 address", clip(c.Properties.PrivateIPAddress))
		}
		return a, nil
	}
	return netip.Addr{}, errors.New("network interface description has no primary IP configuration")
}
