// Package relay relays a sidecar's ADS stream to istiod (Embark's istiod
// mode). The sidecar keeps its one stream to Embark; for each such stream the
// relay opens one upstream ADS stream to istiod, authenticated with the
// sidecar's own bearer token, and passes every discovery request up and every
// response down, so the VM gets exactly what istiod generates for it.
//
// istiod is not the stream's liveness: when the upstream stream fails (istiod
// restarts, is unreachable, refuses) the sidecar's stream stays open and keeps
// its last configuration, while the relay reconnects with capped exponential
// backoff and resynchronises: it sends the sidecar's current subscriptions
// (SotW: resource names and last accepted version; Delta: subscribed names and
// the ACKed resource versions as initial_resource_versions) on the new stream,
// so istiod answers each type afresh. Nonces sent downstream carry the
// upstream stream's generation, so a late ACK of a response from an earlier
// upstream stream is never mistaken for one of the current stream. A Delta
// resynchronisation is split into requests under istiod's message limit.
//
// What a sidecar subscribes to is bounded per stream (Limits: names per type,
// bytes of names per stream); a request over the bounds ends the stream
// ResourceExhausted before anything of it is kept or relayed. The standalone
// server keeps its streams within the same bounds (Subscriptions).
//
// The node sent to istiod is the caller's (Hooks.Node: Embark builds it from
// the sidecar's registration, see package istiodnode), else the sidecar's;
// either way the relay strips the node metadata that would make istiod
// register or health-check a WorkloadEntry of its own (AUTO_REGISTER_GROUP,
// WORKLOAD_ENTRY): Embark owns the VM's WorkloadEntry. What is relayed is
// decided by the caller's Hooks (Embark keeps health reports and refuses debug
// types on sidecar streams).
package relay
