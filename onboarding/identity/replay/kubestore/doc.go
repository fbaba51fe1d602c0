// Package kubestore is the replay.Shared store of an endpoint deployment on
// its API server: every used single-use credential (a signed STS request, a
// JWT's issuer and jti) is a coordination.k8s.io/v1 Lease in the endpoint's
// namespace, named after the SHA-256 of the credential's key and created
// once. The API server's create is the one decision every replica shares:
// AlreadyExists, for a Lease that has not expired, is a replay.
//
// A Lease's renewTime plus leaseDurationSeconds is when the credential
// would be refused as expired anyway; holderIdentity names the replica that
// accepted it. Collect (run by Run on every replica) deletes the expired
// Leases. Each accepted credential costs one create and, once expired, one
// delete; every write goes through the replica's write budget.
package kubestore
