// Package sidecar writes the files Istio's agent (pilot-agent) reads on a VM
// from an onboarding bootstrap — cluster.env, the mesh config with the
// discovery address and readiness probe, the root certificate and the
// sidecar token — each replaced atomically (written to a temporary file in
// the same directory, synced, renamed), and runs the commands that restart
// and stop the sidecar.
package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/embark-mesh/embark/onboarding/agent/config"
	onboardingv1alpha1 "github.com/embark-mesh/embark/onboarding/api/v1alpha1"
)

// Files renders and writes the bootstrap.
type Files struct {
	Paths config.BootstrapFiles
	// Revision of the Istio control plane (empty: default).
	Revision string
}

// Identity is what the registration says about the workload, beyond the
// bootstrap itself.
type Identity struct {
	Namespace        string
	RegistrationName string
}

// Write writes every file of boot. The token file is written last so that a
// sidecar that starts at any point sees a complete configuration.
func (f *Files) Write(id Identity, boot *onboardingv1alpha1.SidecarBootstrap) error {
	env, err := ClusterEnv(id, boot, f.Revision, f.Paths.RootCert)
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
		{f.Paths.ClusterEnv, env, 0o644},
		{f.Paths.MeshConfig, mesh, 0o644},
		{f.Paths.RootCert, boot.GetRootCertificates(), 0o644},
		{f.Paths.Token, []byte(boot.GetSidecarToken()), 0o640},
	} {
		if err := WriteAtomic(w.path, w.data, w.mode); err != nil {
			return err
		}
	}
	return nil
}

// WriteToken replaces the sidecar token file (Istio's agent rereads it for
// every request).
func (f *Files) WriteToken(token string) error {
	return WriteAtomic(f.Paths.Token, []byte(token), 0o640)
}

// ClusterEnv renders cluster.env: the environment Istio's agent starts with
// (the node ID is sidecar~INSTANCE_IP~POD_NAME.POD_NAMESPACE~...). rootCert
// is the path of the bootstrap's root certificates: pilot-agent verifies the
// discovery address with them (XDS_ROOT_CA) and the certificate service,
// which the endpoint serves on the same address (CA_ROOT_CA; CA_ADDR is left
// to default to the discovery address). The workload certificate comes from
// that service: no FILE_MOUNTED_CERTS. Neither AUTO_REGISTER_GROUP nor
// WORKLOAD_ENTRY metadata is set, so istiod's own auto-registration never
// takes the sidecar for one it registers.
func ClusterEnv(id Identity, boot *onboardingv1alpha1.SidecarBootstrap, revision, rootCert string) ([]byte, error) {
	labels, err := json.Marshal(boot.GetLabels())
	if err != nil {
		return nil, fmt.Errorf("encode workload labels: %w", err)
	}
	vars := map[string]string{
		"POD_NAME":                 id.RegistrationName,
		"POD_NAMESPACE":            id.Namespace,
		"ISTIO_NAMESPACE":          id.Namespace,
		"INSTANCE_IP":              boot.GetInstanceIp(),
		"SERVICE_ACCOUNT":          boot.GetServiceAccount(),
		"TRUST_DOMAIN":             boot.GetTrustDomain(),
		"ISTIO_META_CLUSTER_ID":    boot.GetClusterId(),
		"ISTIO_META_NETWORK":       boot.GetNetwork(),
		"ISTIO_METAJSON_LABELS":    string(labels),
		"CANONICAL_SERVICE":        boot.GetLabels()["app"],
		"CANONICAL_REVISION":       boot.GetLabels()["version"],
		"ISTIO_META_WORKLOAD_NAME": id.RegistrationName,
	}
	if revision != "" {
		vars["ISTIO_REVISION"] = revision
	}
	if rootCert != "" {
		vars["XDS_ROOT_CA"] = rootCert
		vars["CA_ROOT_CA"] = rootCert
	}
	keys := make([]string, 0, len(vars))
	for k := range vars {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	b.WriteString("# Written by onboarding-agent from registration " + id.Namespace + "/" + id.RegistrationName + ". Do not edit.\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, shellQuote(vars[k]))
	}
	return b.Bytes(), nil
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
