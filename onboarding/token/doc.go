// Package token issues and verifies the onboarding token: the short-lived JWT
// that Embark's onboarding endpoint hands to an onboarding agent once it has
// verified the agent's platform identity and authorized it by an
// OnboardingPolicy. The agent presents the token as its session credential on
// later calls (register, renew the sidecar credential, unregister), and the
// endpoint re-checks it with [Issuer.Verify] instead of verifying the platform
// identity again.
//
// # Token
//
// A token is a compact JWS signed with the endpoint's private key. Its
// protected header carries "typ": "JWT", the algorithm of the key (ES256 for
// EC P-256, RS256 for RSA of 2048 to 8192 bits, EdDSA for Ed25519) and "kid",
// the key's RFC 7638 SHA-256 thumbprint. Its claims are:
//
//   - iss: the configured issuer (the endpoint's URL);
//   - aud: exactly one audience, this onboarding plane's;
//   - sub: "<namespace>/<workload-auto-registration-name>";
//   - iat, nbf: the time of issue; exp: iat plus the lifetime
//     (tokenIssuer.jwt.expiration, default 1h, within [1m, 24h]);
//   - jti: 128 random bits;
//   - "embark.io/workload": {"workloadGroup": "<namespace>/<name>",
//     "identity": "<workload identity>", "verified": {<identity>}}, what the
//     endpoint needs to re-check the registration and re-evaluate
//     OnboardingPolicies without the platform credential; "verified" is the
//     verified identity as a WorkloadAutoRegistration's spec.identity records
//     it.
//
// # Keys
//
// Keys come from a [KeySource]: the current key signs, the current and the
// previous key verify, so a rotation never invalidates a token before it
// expires. [SecretKeySource] follows the endpoint's signing-key Secret (data
// keys current.pem and previous.pem) through an informer and swaps the key set
// atomically; [StaticKeySource] holds a fixed set, for files and tests.
// [EnsureKeySecret] creates the Secret with a fresh key when it is missing and
// [Rotate] moves the current key to previous and generates a new one.
// Issuing and verifying read the key set through an atomic pointer and never
// wait for the API server.
//
// # Refusals
//
// Verify refuses a token with an [*Error] whose [Reason] says why; every
// Reason is also an error value for errors.Is. The endpoint maps all of them
// to an authentication failure. This package knows nothing about gRPC.
// docs/onboarding-token.md explains the reasons to operators.
package token
