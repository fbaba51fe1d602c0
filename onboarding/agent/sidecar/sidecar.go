// Package sidecar writes the files Istio's sidecar package (istio-sidecar:
// istio.service running istio-start.sh, which sources cluster.env as root and
// starts pilot-agent as istio-proxy) reads on a VM from an onboarding
// bootstrap — cluster.env, the mesh config with the discovery address and
// readiness probe, the root certificate and the sidecar token — each replaced
// atomically (written to a temporary file in the same directory, synced,
// renamed).
//
// The unprivileged agent never writes a file a root process sources. It
// stages cluster.env, the mesh config and the root certificate in a directory
// of its own and writes a request (Stage, Request); the root-run
// onboarding-agent-sidecar.service, started by a systemd path unit, reads the
// staged files through an os.Root, admits only what ClusterEnv renders
// (ParseClusterEnv), installs canonical copies at the upstream paths and
// restarts or stops istio.service (Apply). Only the token, which pilot-agent
// reads as istio-proxy and no root process reads, is written by the agent in
// place. Tests and development setups may instead let the agent write every
// path and run restart/stop commands itself (Write, Run).
package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/embark-mesh/embark/onboarding/agent/config"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
)

// Files renders and writes the bootstrap.
type Files struct {
	Paths config.BootstrapFiles
	// Env configures what ClusterEnv renders beyond the bootstrap.
	Env EnvOptions
}

// EnvOptions are cluster.env settings of the agent's configuration.
type EnvOptions struct {
	// Revision of the Istio control plane (empty: default).
	Revision string
	// CAAddress is CA_ADDR. Empty: not written, so istio-start.sh and
	// pilot-agent use the discovery address (PILOT_ADDRESS), where Embark
	// relays istiod's certificate service.
	CAAddress string
	// RootCert is the installed root certificate's path, written as
	// XDS_ROOT_CA and CA_ROOT_CA (Files sets it from Paths.RootCert).
	RootCert string
	// DNSAddress, when set, turns on pilot-agent's DNS proxy
	// (ISTIO_META_DNS_CAPTURE=true) listening there (DNS_PROXY_ADDR).
	// Empty: the proxy is off.
	DNSAddress string
	// DNSAutoAllocate asks istiod to allocate addresses for ServiceEntry
	// hosts that declare none (ISTIO_META_DNS_AUTO_ALLOCATE=true). Only
	// with DNSAddress.
	DNSAutoAllocate bool
}

// Staged file names in the staging directory.
const (
	StagedClusterEnv = "cluster.env"
	StagedMeshConfig = "mesh"
	StagedRootCert   = "root-cert.pem"
	RequestFile      = "request"
)

// Identity is what the registration says about the workload, beyond the
// bootstrap itself.
type Identity struct {
	Namespace        string
	RegistrationName string
}

// Write writes every file of boot. The token file is written last so that a
// sidecar that starts at any point sees a complete configuration.
func (f *Files) Write(id Identity, boot *onboardingv1alpha1.SidecarBootstrap) error {
	return f.write(id, boot, f.Paths.ClusterEnv, f.Paths.MeshConfig, f.Paths.RootCert)
}

// Stage writes cluster.env, the mesh config and the root certificate into
// dir (for Apply to install) and the token at its path, last.
func (f *Files) Stage(dir string, id Identity, boot *onboardingv1alpha1.SidecarBootstrap) error {
	return f.write(id, boot, filepath.Join(dir, StagedClusterEnv), filepath.Join(dir, StagedMeshConfig), filepath.Join(dir, StagedRootCert))
}

func (f *Files) write(id Identity, boot *onboardingv1alpha1.SidecarBootstrap, envPath, meshPath, rootPath string) error {
	opts := f.Env
	if opts.RootCert == "" {
		opts.RootCert = f.Paths.RootCert
	}
	env, err := ClusterEnv(id, boot, opts)
	if err != nil {
		return err
	}
	mesh, err := MeshConfig(boot)
	if err != nil {
		return err
	}
	for _, w := range []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{envPath, env, 0o644},
		{meshPath, mesh, 0o644},
		{rootPath, boot.GetRootCertificates(), 0o644},
		{f.Paths.Token, []byte(boot.GetSidecarToken()), 0o640},
	} {
		if err := WriteAtomic(w.path, w.data, w.mode); err != nil {
			return err
		}
	}
	return nil
}

// InstallRoots installs roots (PEM certificates only, re-encoded) at the
// root certificate's path when they differ from what is installed, and
// reports whether they did. The file is replaced atomically; pilot-agent
// watches it and dials the discovery address with it from its next
// connection on.
func (f *Files) InstallRoots(roots []byte) (bool, error) {
	certs, err := canonicalCerts(roots)
	if err != nil {
		return false, fmt.Errorf("root certificates: %w", err)
	}
	return installRoots(f.Paths.RootCert, certs)
}

// StageRoots stages roots in dir for a RequestRoots when they differ from
// the installed root certificate, and reports whether they did (then the
// caller sends the request).
func (f *Files) StageRoots(dir string, roots []byte) (bool, error) {
	certs, err := canonicalCerts(roots)
	if err != nil {
		return false, fmt.Errorf("root certificates: %w", err)
	}
	if installed(f.Paths.RootCert, certs) {
		return false, nil
	}
	return true, WriteAtomic(filepath.Join(dir, StagedRootCert), certs, 0o644)
}

// WriteToken replaces the sidecar token file (Istio's agent rereads it for
// every request).
func (f *Files) WriteToken(token string) error {
	return WriteAtomic(f.Paths.Token, []byte(token), 0o640)
}

// Settings of cluster.env that Apply enforces: Istio's istio-start.sh
// installs no iptables rules (ISTIO_CUSTOM_IP_TABLES=true) and keeps
// pilot-agent as istio-proxy (only TPROXY would make it root); the proxy
// tells istiod it captures no traffic (INTERCEPTION_MODE NONE), so its
// listeners bind the addresses the Sidecar resource names.
var fixedEnv = map[string]string{
	"ISTIO_CUSTOM_IP_TABLES":          "true",
	"ISTIO_INBOUND_INTERCEPTION_MODE": "NONE",
	"ISTIO_META_INTERCEPTION_MODE":    "NONE",
}

// firstLabel returns the value of the first of keys that labels sets, or
// "". The endpoint computes Istio's canonical service labels for every
// workload; app and version are what endpoints of earlier versions sent.
func firstLabel(labels map[string]string, keys ...string) string {
	for _, k := range keys {
		if v := labels[k]; v != "" {
			return v
		}
	}
	return ""
}

// ClusterEnv renders cluster.env, which Istio's istio-start.sh sources
// before starting pilot-agent: PILOT_ADDRESS (the discovery address,
// which istio-start.sh puts in PROXY_CONFIG over the mesh config; CA_ADDR
// defaults to it), CA_ADDR when configured, XDS_ROOT_CA and CA_ROOT_CA,
// ISTIO_SVC_IP/INSTANCE_IP, POD_NAME and ISTIO_NAMESPACE/POD_NAMESPACE (the
// node ID is sidecar~ISTIO_SVC_IP~POD_NAME.NAMESPACE~...), the fixed
// no-iptables settings, the DNS proxy's settings when it is on (pilot-agent
// answers mesh names on DNS_PROXY_ADDR from istiod's name table; no
// iptables rule sends it anything, the host's resolver does), and the
// workload's metadata.
func ClusterEnv(id Identity, boot *onboardingv1alpha1.SidecarBootstrap, opts EnvOptions) ([]byte, error) {
	labels, err := json.Marshal(boot.GetLabels())
	if err != nil {
		return nil, fmt.Errorf("encode workload labels: %w", err)
	}
	vars := map[string]string{
		"PILOT_ADDRESS":            boot.GetDiscoveryAddress(),
		"ISTIO_SVC_IP":             boot.GetInstanceIp(),
		"POD_NAME":                 id.RegistrationName,
		"POD_NAMESPACE":            id.Namespace,
		"ISTIO_NAMESPACE":          id.Namespace,
		"INSTANCE_IP":              boot.GetInstanceIp(),
		"SERVICE_ACCOUNT":          boot.GetServiceAccount(),
		"TRUST_DOMAIN":             boot.GetTrustDomain(),
		"ISTIO_META_CLUSTER_ID":    boot.GetClusterId(),
		"ISTIO_META_NETWORK":       boot.GetNetwork(),
		"ISTIO_METAJSON_LABELS":    string(labels),
		"CANONICAL_SERVICE":        firstLabel(boot.GetLabels(), "service.istio.io/canonical-name", "app"),
		"CANONICAL_REVISION":       firstLabel(boot.GetLabels(), "service.istio.io/canonical-revision", "version"),
		"ISTIO_META_WORKLOAD_NAME": id.RegistrationName,
	}
	if opts.Revision != "" {
		vars["ISTIO_REVISION"] = opts.Revision
	}
	if opts.CAAddress != "" {
		vars["CA_ADDR"] = opts.CAAddress
	}
	if opts.RootCert != "" {
		vars["XDS_ROOT_CA"] = opts.RootCert
		vars["CA_ROOT_CA"] = opts.RootCert
	}
	if opts.DNSAddress != "" {
		vars["ISTIO_META_DNS_CAPTURE"] = "true"
		vars["DNS_PROXY_ADDR"] = opts.DNSAddress
		if opts.DNSAutoAllocate {
			vars["ISTIO_META_DNS_AUTO_ALLOCATE"] = "true"
		}
	}
	for k, v := range fixedEnv {
		vars[k] = v
	}
	return renderEnv(vars)
}

// MeshConfig renders the mesh config: defaultConfig is the bootstrap's
// ProxyConfig (discoveryAddress, readinessProbe).
func MeshConfig(boot *onboardingv1alpha1.SidecarBootstrap) ([]byte, error) {
	pc := map[string]any{}
	if s := boot.GetProxyConfigJson(); s != "" {
		if err := json.Unmarshal([]byte(s), &pc); err != nil {
			return nil, fmt.Errorf("decode the bootstrap's ProxyConfig: %w", err)
		}
	}
	if boot.GetDiscoveryAddress() != "" {
		pc["discoveryAddress"] = boot.GetDiscoveryAddress()
	}
	out, err := yaml.Marshal(map[string]any{"defaultConfig": pc})
	if err != nil {
		return nil, fmt.Errorf("encode mesh config: %w", err)
	}
	return out, nil
}

// Request asks onboarding-agent-sidecar.service, through the path unit
// watching dir/request, to install the staged files and restart the
// sidecar (RequestRestart) or to stop it (RequestStop). The request carries
// a sequence number so that each one changes the file.
func Request(dir string, action Action, seq uint64) error {
	return WriteAtomic(filepath.Join(dir, RequestFile), fmt.Appendf(nil, "%s %d\n", action, seq), 0o644)
}

// shellQuote quotes s for a systemd EnvironmentFile and a POSIX shell alike.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// WriteAtomic replaces path with data: a temporary file in the same
// directory is written, synced and renamed over path, so a reader sees the
// old or the new content, never a mix. Missing directories are created.
func WriteAtomic(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	name := tmp.Name()
	cleanup := func(err error) error {
		_ = tmp.Close()
		_ = os.Remove(name)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return cleanup(err)
	}
	if err := tmp.Chmod(mode); err != nil {
		return cleanup(err)
	}
	if err := tmp.Sync(); err != nil {
		return cleanup(err)
	}
	if err := tmp.Close(); err != nil {
		return cleanup(err)
	}
	if err := os.Rename(name, path); err != nil {
		_ = os.Remove(name)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Run runs argv (no shell) and returns its combined output in the error.
func Run(ctx context.Context, argv []string) error {
	if len(argv) == 0 || argv[0] == "" {
		return errors.New("empty command")
	}
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if len(msg) > 2048 {
			msg = msg[:2048] + "..."
		}
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, msg)
	}
	return nil
}
