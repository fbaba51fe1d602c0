package azure

import (
	"regexp"
	"strings"

	"github.com/embark-mesh/embark/onboarding/identity"
)

// claim names of a managed identity token, by attribute name.
const (
	attrTenant   = "tid"
	attrObjectID = "oid"
	attrMIRID    = "xms_mirid"
	attrIssuedAt = "iat"
)

var secondsRE = regexp.MustCompile(`^[0-9]{1,20}$`)

func claimPaths() map[string]string {
	return map[string]string{attrTenant: "tid", attrObjectID: "oid", attrMIRID: "xms_mirid", attrIssuedAt: "iat"}
}

// parseIdentity reads the VM identity from a verified token's claims
// (attrs): tid must be tenant (the tenant of the token's issuer), oid a
// GUID, iat set and xms_mirid a virtual machine's resource ID.
func parseIdentity(tenant string, attrs map[string]string) (*identity.AzureIdentity, error) {
	tid, ok := attrs[attrTenant]
	if !ok {
		return nil, identity.Refuse(identity.ReasonMalformed, "token has no tid (tenant) claim")
	}
	if !strings.EqualFold(tid, tenant) {
		return nil, identity.Refuse(identity.ReasonMalformed, "token claim tid %q is not the tenant %s of its issuer", clip(tid), tenant)
	}
	oid, ok := attrs[attrObjectID]
	if !ok || !guidRE.MatchString(oid) {
		return nil, identity.Refuse(identity.ReasonMalformed, "token claim oid %q is not an object ID (GUID)", clip(oid))
	}
	// Entra ID always sets iat; without it the token's lifetime could only
	// be counted from now.
	if !secondsRE.MatchString(attrs[attrIssuedAt]) {
		return nil, identity.Refuse(identity.ReasonMalformed, "token has no iat (issued-at) as a number of seconds")
	}
	mirid, ok := attrs[attrMIRID]
	if !ok {
		return nil, identity.Refuse(identity.ReasonMalformed, "token has no xms_mirid claim: it must be an access token of a VM's managed identity from the Instance Metadata Service")
	}
	vm, err := ParseVMResourceID(mirid)
	if err != nil {
		return nil, identity.RefuseWrap(identity.ReasonMalformed, err, "token claim xms_mirid")
	}
	return &identity.AzureIdentity{
		TenantID: strings.ToLower(tenant), SubscriptionID: vm.SubscriptionID, ResourceGroup: vm.ResourceGroup,
		VMName: vm.Name, PrincipalID: strings.ToLower(oid), ResourceID: mirid,
	}, nil
}
