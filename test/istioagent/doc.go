// Package istioagent runs Istio's real pilot-agent as a VM sidecar in tests, so
// that Embark's xDS server is exercised by the client it serves in production
// rather than by a fake.
//
// pilot-agent (built by test/tools/install.sh into bin/testenv/) runs as
// `pilot-agent proxy sidecar` with DISABLE_ENVOY=true, each agent in a working
// directory of its own. Without Envoy, nothing connects to the agent's xDS
// proxy, so the agent opens no upstream stream; Connect plays Envoy's part: it
// dials the agent's XDS unix socket and sends the node pilot-agent generated, and
// pilot-agent then opens an ADS stream to the discovery address with its own
// credentials and headers and relays both ways.
//
// # Certificates: a real CA, as on a VM
//
// pilot-agent asks its CA for its workload certificate, as on a VM: the
// IstioCertificateService at CA_ADDR (Options.CAAddress; default the discovery
// address, where Embark relays istiod's CA), over TLS verified with
// CA_ROOT_CA (Options.CARootCA, default Options.XDSRootCA: Embark's bootstrap
// names one root file for both). It sends the same token as on its xDS
// stream. Without a CA root it would exit at once ("failed to find root CA cert
// for CA"), so Start refuses to run without one. The tests of Embark give it
// Embark's certificate relay in front of a real istiod (testenv.StartIstiod)
// and check the certificate it got (Agent.WaitCertificates): pilot-agent
// without Envoy serves no SDS socket (pkg/istio-agent/agent.go, initSdsServer:
// with DisableEnvoy it only fetches and rotates the certificates), so Start
// sets OUTPUT_CERTS and pilot-agent writes there what it would serve over SDS
// as `default` and `ROOTCA`.
//
// FILE_MOUNTED_CERTS (self-provisioned certificate files, which pilot-agent
// serves without asking a CA) is not used by any test. The one exception to a
// real CA is Options.NoCA, for this package's own tests of pilot-agent's xDS
// path against an xDS server that is not Embark: CA_ADDR is a loopback port
// nothing listens on, pilot-agent retries its certificate in the background,
// and its xDS proxy, which never waits for certificates, works regardless.
// No certificate exists there at all, self-signed or other.
//
// The upstream connection is plaintext when the ProxyConfig's
// controlPlaneAuthPolicy is NONE (the zero value here, unlike Istio's default)
// and TLS verified with Options.XDSRootCA when it is MUTUAL_TLS. Either way
// pilot-agent attaches `authorization: Bearer <token>` from
// ./var/run/secrets/tokens/istio-token when that file exists (see
// Agent.SetToken) and every Options.XDSHeaders entry as a request header.
//
// Start also sets CLOUD_PLATFORM=none (pilot-agent would otherwise probe the
// cloud metadata endpoints for up to 5 s) and gives each agent a free status port
// (pilot-agent rejects 0), so that agents can run in parallel.
package istioagent
