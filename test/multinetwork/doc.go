// Package multinetwork tests a mesh of two networks with the real istiod
// (pilot-discovery of the pinned Istio, started once for the package by
// TestMain): pods on kube-network (the label on istiod's namespace) behind a
// gateway Service labelled with that network, the group's VMs on
// virtual-machines relayed through Embark in istiod mode, and the VM
// network's gateway declared in meshNetworks or not at all. Each test reads
// what istiod serves each side (EDS of the VM's sidecar through Embark, EDS
// of a pod's proxy, listeners and clusters of the east-west gateway) as
// docs/multi-network.md describes it.
package multinetwork
