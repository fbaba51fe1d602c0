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
// # How pilot-agent runs without Envoy and without a CA
//
// By default pilot-agent asks a CA for its workload certificate: the
// IstioCertificateService at CA_ADDR, which defaults to the discovery address,
// over TLS verified with ./var/run/secrets/istio/root-cert.pem. Without that file
// it exits at once ("failed to find root CA cert for CA"); with it, and no CA to
// answer, it retries forever in the background against the discovery address.
// Neither is wanted here, so Start sets FILE_MOUNTED_CERTS=true, which makes
// pilot-agent create no CA client at all, and writes a self-signed workload
// certificate (key.pem, cert-chain.pem, root-cert.pem under ./etc/certs/, the
// files a VM gets when certificates are provisioned out of band). pilot-agent
// reads them once and is done; it never contacts a CA, and its xDS proxy, which
// never waits for certificates, starts at once. (With FILE_MOUNTED_CERTS and no
// files it would log "failed to get certificate" with backoff forever.)
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
