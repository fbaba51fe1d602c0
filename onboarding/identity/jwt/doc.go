// Package jwt verifies the identity of on-premises hosts that present a JWT
// of an OIDC issuer the operator configured, and matches verified JWT
// identities against the jwt{issuer, subjects, attributes} rules of an
// OnboardingPolicy.
//
// # Trust model
//
// A token is believed only if all of these hold:
//
//   - its alg is one of RS256, RS384, RS512, PS256, PS384, PS512, ES256,
//     ES384, ES512 or EdDSA. "none" and the HMAC algorithms (HS*) are
//     refused outright: a shared secret cannot prove which party signed;
//   - its iss is exactly the Issuer of one [IssuerConfig] (an unknown issuer
//     is refused before any key is looked at);
//   - its signature verifies with a public key of that issuer's key set
//     (inline JWKS, or a JWKS URL fetched over HTTPS and cached), chosen by
//     the token's kid and compatible with the token's alg; RSA keys must
//     have at least 2048 bits;
//   - its aud contains one of the issuer's configured audiences;
//   - it has exp in the future and nbf/iat not in the future, each with a
//     small leeway (default one minute).
//
// The verified identity carries the issuer, its short name, the subject and
// the attributes read from the claims by the issuer's configured paths; its
// workload-identity name is jwt-<shortName>-<subject> reduced to DNS-1123
// label characters.
//
// Remote key sets are fetched lazily, refreshed after the refresh interval
// (default 1h), refetched early when a token names an unknown kid (key
// rotation), and never fetched more often than the minimum refresh interval
// (default 30s), however many tokens with unknown kids arrive. A failed
// refresh keeps the last good key set.
//
// Parsing and signature verification use go-jose v4.
package jwt
