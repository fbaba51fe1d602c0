// Package identity holds benchmarks of Embark's platform identity
// verifiers (onboarding/identity/...): verifications per second of an EC2
// instance identity document (RSA-2048 PKCS#7), of a document with an STS
// proof through loopback fakes, and of JWTs, next to the raw cost of one
// RSA-2048 PKCS#1 v1.5 signature verification measured in the same run.
//
// Run with: go test -run='^$' -bench=. -benchmem ./benchmarks/identity/
package identity
