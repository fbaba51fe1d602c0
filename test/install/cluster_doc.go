// Package install is the end-to-end install test: the Helm chart rendered
// with the README's values and applied to a real API server, the endpoint
// run from the image `make image` built (runc, in a network namespace of
// its own) with what the rendered Deployment says, and a VM in another
// namespace following docs/vm-install.md. It needs root, `make image` and
// `make packages` (`make install-test` runs it).
//
// The parsers of the docs it follows (README.md's `helm install` block,
// the operator guide's objects) and the gateway's port forwarding build
// without the install tag, so `make test` and `make fuzz` run their
// tests.
package install
