// Package identity holds what Embark's onboarding endpoint knows about a
// workload once one of its platform identity verifiers has checked the
// workload's credential, and how a verifier says no.
//
// # Trust model
//
// Nothing a workload says about itself is believed. A workload presents a
// platform credential and a verifier turns it into an [Identity] only after
// proving it against trust anchors that the operator configured:
//
//   - AWS EC2 (package [github.com/embark-mesh/embark/onboarding/identity/aws]):
//     the instance identity document is trusted only when its RSA-2048
//     PKCS#7 signature verifies against the AWS certificate configured for
//     the region named in the document, and the signed content is the
//     submitted document byte for byte. The IAM role is trusted only when a
//     signed sts:GetCallerIdentity request, bound to this onboarding plane by
//     a signed audience header and fresh, is answered by STS with an
//     assumed-role ARN of the document's account and instance.
//   - OIDC/JWT (package [github.com/embark-mesh/embark/onboarding/identity/jwt]):
//     a token is trusted only when it is signed with an asymmetric algorithm
//     by a key of a configured issuer, names that issuer, is addressed to one
//     of the configured audiences and is within its validity period.
//
// Everything else (the document's pendingTime, certificates embedded in a
// PKCS#7 envelope, the URL an agent signed its STS request for, keys or
// algorithms named by a token) is either ignored or checked against local
// configuration.
//
// A verifier answers with a verified [Identity] or with a
// [*VerificationError] whose [Reason] names what failed. Every reason is a
// refusal of the credential; the endpoint reports all of them as an
// authentication failure with the error's message, which is written for an
// operator. This package knows nothing about gRPC.
//
// Policy decisions (which accounts, roles, issuers or subjects may join which
// WorkloadGroup) are not made here: an [Identity] carries the verified facts,
// [Identity.CheckIAMRole] and the jwt package's Rule help the policy code.
package identity
