// Package revision chooses the istiod revision each workload is served by,
// when one Embark relays to several istiod revisions (a canary upgrade: a
// new istiod beside the old one, namespaces moved by their istio.io/rev
// label).
//
// A workload's revision is chosen as Istio's sidecar injection webhooks
// choose a pod's (Choose): its namespace's labels first (istio-injection=
// enabled: the default revision; else istio.io/rev), then its WorkloadGroup's
// istio.io/rev (the pod's own label, which Istio honours only in a namespace
// with neither label), else the default revision. A revision Embark is not
// configured for is served by the default revision, with a Warning Event
// UnknownIstioRevision on the registration.
//
// A Selector reads Namespaces, WorkloadGroups and registrations from the
// informer cache; Changed, called on every Namespace or WorkloadGroup event,
// wakes each relayed stream, which asks its revision again and, when it
// changed, moves its upstream stream to that revision's istiod (package
// relay). The replica holding the stream then records the revision on the
// registration and its WorkloadEntry (registry.AnnotationIstioRevision).
// The entry never carries istio.io/rev: istiod takes an entry labelled with
// a revision only when it is its own, and pods of every revision must keep
// the VM as an endpoint while it moves.
package revision
