// Package aws verifies the identity of AWS EC2 instances for Embark's
// onboarding endpoint.
//
// # What an instance presents
//
// A [Credential]: the instance identity document and its RSA-2048 PKCS#7
// signature, exactly as IMDS serves them at
// /latest/dynamic/instance-identity/document and .../rsa2048, and
// optionally an [STSRequest]: a sts:GetCallerIdentity request signed
// (SigV4) with the instance profile's role credentials and carrying the
// onboarding endpoint's audience in the signed [AudienceHeader]. These types
// are package awswire's, which the agent shares; package client produces
// both on the instance through aws-sdk-go-v2.
//
// # What is trusted, and why
//
// The document is believed when, and only when:
//
//   - the signature is a PKCS#7 SignedData with exactly one signer whose
//     enclosed content is the submitted document byte for byte. The
//     package reads it with its own parser for the shape AWS signs (BER
//     indefinite lengths in the envelope, a DER SignerInfo), in place and
//     without converting it to DER; anything else is malformed;
//   - the document names a region whose AWS certificate is in the
//     verifier's trust set (default: the certificates embedded in package
//     certs; replace or extend it with WithTrustedCertificates and
//     WithAdditionalCertificates); an unknown region is refused;
//   - the signature verifies with that certificate alone, whose RSA key is
//     taken once when the verifier is made. Certificates
//     enclosed in the PKCS#7 envelope are discarded before verification, so
//     a signature made by any other key (including one whose certificate
//     copies the AWS certificate's issuer and serial number) fails.
//
// The document's pendingTime is not checked: a document never changes
// during an instance's life, so its age says nothing. A document is not a
// secret either: anything running on the instance, or anyone it was ever
// shown to, can present it. Two defences follow: [ReuseDecision] (a
// document already bound to a live registration is accepted again only
// from that registration's address or with a fresh STS proof), and the STS
// proof itself.
//
// The IAM role is believed only from an STS proof. The verifier checks the
// signed request locally first: it is a POST of exactly
// Action=GetCallerIdentity&Version=2011-06-15 to the STS endpoint the
// verifier is configured with for the document's region (default: AWS's
// regional STS endpoint as aws-sdk-go-v2 resolves it; WithSTSEndpoint
// overrides it), signed with AWS4-HMAC-SHA256 for service sts; its
// SignedHeaders include host, x-amz-date and x-embark-onboarding-audience
// and the audience equals the verifier's (binding: a request made for
// another onboarding plane, or whose audience header was added or changed
// after signing, cannot be used here); its X-Amz-Date is at most the
// freshness window old (default 5 minutes) and at most the clock skew
// (default 1 minute) in the future; and it has not been used before
// (per-verifier replay cache). Only then does the verifier send it, with
// exactly its signed headers, to that endpoint, never to the URL the agent
// named. STS checks the signature; its answer must be
// arn:<partition>:sts::<account>:assumed-role/<role>/<instance-id> with the
// document's partition, account and instance ID (EC2 names instance
// profile sessions after the instance). The role is then a verified fact;
// whether a policy allows it is decided with identity.Identity.CheckIAMRole.
//
// Every refusal is an *identity.VerificationError whose Reason names the
// cause; docs/identity.md says what an operator does about each.
//
// Package awstest holds loopback fakes of IMDS and STS for tests and demos.
package aws
