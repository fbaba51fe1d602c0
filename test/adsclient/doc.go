// Package adsclient is the ADS client of Embark's tests and benchmarks: it
// dials an xDS server (plaintext or TLS), opens a State-of-the-World or Delta
// stream carrying a sidecar's token, requests resources of a type, receives
// with a deadline, ACKs or NACKs what it received, and closes.
//
// It speaks the protocol as Envoy and Istio's agent do: the node goes with
// the first request only, an ACK repeats the response's version and nonce
// (and, in SotW, the names last requested of that type), a NACK carries the
// last accepted version and an error detail. Tests whose point is a
// malformed or hostile frame build their requests themselves and send them
// with Send.
package adsclient
