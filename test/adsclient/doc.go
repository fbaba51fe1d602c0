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
//
// A stream is for one goroutine at a time, except that one goroutine may
// receive (Recv, Next, Wait) while another sends (Send, Request, ACK, NACK),
// as gRPC allows. A receive that timed out stays pending and the next one
// returns its message, so a deadline never drops a response.
package adsclient
