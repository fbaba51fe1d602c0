// Package istiod tests Embark beside a real istiod (pilot-discovery built from
// the pinned Istio module, started once for the package by TestMain with its
// WorkloadEntry clean-up made fast): istiod keeps Embark's WorkloadEntries
// and their health, VM sidecars get their workload certificate from istiod's
// CA through Embark's certificate relay, and a pod's proxy receives the VM
// as an endpoint of the Service its WorkloadGroup's labels select, only
// while it is healthy and registered.
package istiod
