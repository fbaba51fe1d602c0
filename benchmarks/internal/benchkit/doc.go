// Package benchkit holds the set-up the xDS benchmarks (relay, streams and
// push) share: their common flags, the body of their TestMain (a real
// kube-apiserver and etcd, an informer cache with the registry's indexes and
// a clientset), and the registration of N workloads through the registry's
// own Register, with node IDs built by registry/nodeid.
//
// It holds set-up only: what each benchmark measures stays in its package.
package benchkit
