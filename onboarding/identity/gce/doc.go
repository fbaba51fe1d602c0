// Package gce verifies Google Compute Engine instance identity tokens: the
// JWT an instance's metadata server issues (service-accounts/default/identity
// with format=full), signed by Google. The verifier pins the issuer
// https://accounts.google.com, checks the signature against Google's
// published JWKS (fetched, cached and refreshed by the jwt package's key
// set), the audience (the onboarding endpoint), exp/iat and the token's
// lifetime, requires every google.compute_engine claim and a verified
// service account email, and accepts each token once. The token proves no
// address of the instance. With an InstanceChecker (Config.InstanceCheck, a
// rate-limited and cached Checker of the Compute API's
// compute.instances.get) the instance must exist under the token's name
// with the token's numeric ID and be RUNNING, and the internal address of
// its primary network interface is proven; without it the addresses a GCE
// workload registers must be listed in the addressCIDRs of the policy rule
// allowing it.
package gce
