// Package azure verifies Azure VM managed identity tokens: the Entra ID
// access token an Azure VM's Instance Metadata Service issues to the VM's
// system-assigned managed identity (/metadata/identity/oauth2/token with the
// onboarding endpoint as resource). The verifier pins the issuer of every
// allowed tenant (https://sts.windows.net/<tenant>/ and
// https://login.microsoftonline.com/<tenant>/v2.0), checks the signature
// against the keys Microsoft publishes for the tenant (fetched, cached and
// refreshed by the jwt package's key set), the audience (the onboarding
// endpoint), exp/nbf/iat and the token's lifetime, requires tid (equal to
// the issuer's tenant), oid and xms_mirid (the resource ID of a virtual
// machine), and accepts each token once. The token proves neither the VM's
// location nor an address. The optional VM check (Checker, Config.VMCheck)
// asks Azure Resource Manager, with the endpoint's own token (IMDS or AKS
// workload identity, plain HTTP), about the VM and its primary network
// interface: the VM must exist, provisioned, with the token's principal as
// its system-assigned identity; its location, VM ID and primary private
// address then join the identity. Without it, addresses an Azure workload
// registers must be listed in the addressCIDRs of the policy rule allowing
// it.
package azure
