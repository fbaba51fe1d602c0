package vmsim

import (
	"fmt"
	"os"
	"path/filepath"

	meshconfig "istio.io/api/mesh/v1alpha1"

	"github.com/embark-mesh/embark/onboarding/agent/sidecar"
	"github.com/embark-mesh/embark/test/freeport"
	"github.com/embark-mesh/embark/test/istioagent"
)

// SidecarOptions reads the files the onboarding agent wrote for the sidecar
// in a VM's root directory (cluster.env as pilot-agent's environment, the
// mesh config's ProxyConfig, the root certificates of the discovery
// address) and returns the options to start pilot-agent with there, as the
// sidecar unit would: mutual TLS to the control plane, whose certificate is
// verified as istiodSAN.
func SidecarOptions(root, istiodSAN string) (istioagent.Options, error) {
	data, err := os.ReadFile(filepath.Join(root, ClusterEnv))
	if err != nil {
		return istioagent.Options{}, err
	}
	env, err := sidecar.ParseClusterEnv(data)
	if err != nil {
		return istioagent.Options{}, err
	}
	if data, err = os.ReadFile(filepath.Join(root, MeshConfig)); err != nil {
		return istioagent.Options{}, err
	}
	pc, err := ProxyConfig(data)
	if err != nil {
		return istioagent.Options{}, err
	}
	pc.ControlPlaneAuthPolicy = meshconfig.AuthenticationPolicy_MUTUAL_TLS
	rootCA, err := os.ReadFile(filepath.Join(root, RootCert))
	if err != nil {
		return istioagent.Options{}, err
	}
	if len(rootCA) == 0 {
		return istioagent.Options{}, fmt.Errorf("the onboarding agent wrote an empty %s: the endpoint sent no root certificates", RootCert)
	}
	if addr := env["DNS_PROXY_ADDR"]; addr != "" {
		// Simulated VMs share the host's loopback: each DNS proxy gets a
		// port of its own where a VM would have 127.0.0.1:15053 to itself.
		if env["DNS_PROXY_ADDR"], err = freeDNSAddr(); err != nil {
			return istioagent.Options{}, err
		}
	}
	return istioagent.Options{
		WorkDir:        root,
		PodName:        env["POD_NAME"],
		PodNamespace:   env["POD_NAMESPACE"],
		InstanceIP:     env["INSTANCE_IP"],
		ClusterID:      env["ISTIO_META_CLUSTER_ID"],
		ServiceAccount: env["SERVICE_ACCOUNT"],
		Env:            env,
		ProxyConfig:    pc,
		XDSRootCA:      rootCA,
		IstiodSAN:      istiodSAN,
	}, nil
}

// freeDNSAddr is a loopback address whose port is free for UDP and TCP.
func freeDNSAddr() (string, error) { return freeport.DNSAddr() }
