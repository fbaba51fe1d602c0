package sidecar

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/agent/hostdns"
)

// Action is what a request asks of onboarding-agent-sidecar.service.
type Action string

// Actions.
const (
	RequestRestart Action = "restart"
	RequestStop    Action = "stop"
	// RequestDNSOn points the host's resolver at the sidecar's DNS proxy for
	// the mesh's domains; the agent asks once the proxy answers.
	RequestDNSOn Action = "dns-on"
	// RequestRoots installs the staged root certificate alone, without a
	// restart: pilot-agent watches the file (XDS_ROOT_CA) and uses it for
	// its next connection to the discovery address.
	RequestRoots Action = "roots"
)

// envHeader opens every cluster.env the package renders.
const envHeader = "# Written by onboarding-agent from its registration. Do not edit: it is replaced at every onboarding.\n"

// clusterEnvKeys are the only keys cluster.env may hold: those ClusterEnv
// renders. istio-start.sh sources the file as root, so anything else (an
// ISTIO_BIN_BASE, EXEC_USER or a command) is refused by ParseClusterEnv.
var clusterEnvKeys = map[string]bool{
	"PILOT_ADDRESS": true, "CA_ADDR": true, "ISTIO_SVC_IP": true, "INSTANCE_IP": true,
	"POD_NAME": true, "POD_NAMESPACE": true, "ISTIO_NAMESPACE": true, "SERVICE_ACCOUNT": true,
	"TRUST_DOMAIN": true, "ISTIO_META_CLUSTER_ID": true, "ISTIO_META_NETWORK": true,
	"ISTIO_METAJSON_LABELS": true, "CANONICAL_SERVICE": true, "CANONICAL_REVISION": true,
	"ISTIO_META_WORKLOAD_NAME": true, "ISTIO_REVISION": true, "XDS_ROOT_CA": true, "CA_ROOT_CA": true,
	"ISTIO_CUSTOM_IP_TABLES": true, "ISTIO_INBOUND_INTERCEPTION_MODE": true, "ISTIO_META_INTERCEPTION_MODE": true,
	"ISTIO_META_DNS_CAPTURE": true, "ISTIO_META_DNS_AUTO_ALLOCATE": true, "DNS_PROXY_ADDR": true,
}

// Limits of what Apply reads from the staging directory.
const (
	maxStagedFile = 256 << 10
	maxRequest    = 64
)

// renderEnv renders vars as KEY='value' lines, sorted, after the header.
func renderEnv(vars map[string]string) ([]byte, error) {
	keys := make([]string, 0, len(vars))
	for k, v := range vars {
		if !clusterEnvKeys[k] {
			return nil, fmt.Errorf("cluster.env: key %s is not allowed", k)
		}
		if strings.ContainsAny(v, "\x00\n\r") {
			return nil, fmt.Errorf("cluster.env: %s: value holds a NUL or line break", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	b.WriteString(envHeader)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, shellQuote(vars[k]))
	}
	return b.Bytes(), nil
}

// ParseClusterEnv parses a cluster.env as ClusterEnv renders it: comment
// lines, then KEY='value' lines (a ' inside written '\”) with keys from the
// allowed set, each once, the fixed no-iptables settings present with their
// values. Anything else is an error: the result is safe to render and have
// a root shell source.
func ParseClusterEnv(data []byte) (map[string]string, error) {
	vars := map[string]string{}
	for n, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		key, quoted, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("cluster.env line %d: not KEY='value'", n+1)
		}
		if !clusterEnvKeys[key] {
			return nil, fmt.Errorf("cluster.env line %d: key %q is not allowed", n+1, key)
		}
		if _, dup := vars[key]; dup {
			return nil, fmt.Errorf("cluster.env line %d: %s repeated", n+1, key)
		}
		v, err := shellUnquote(quoted)
		if err != nil {
			return nil, fmt.Errorf("cluster.env line %d: %s: %w", n+1, key, err)
		}
		if strings.ContainsAny(v, "\x00\r") {
			return nil, fmt.Errorf("cluster.env line %d: %s: control character in value", n+1, key)
		}
		vars[key] = v
	}
	for k, want := range fixedEnv {
		if got, ok := vars[k]; !ok || got != want {
			return nil, fmt.Errorf("cluster.env: %s must be %q", k, want)
		}
	}
	return vars, nil
}

// shellUnquote reverses shellQuote: one or more '...' runs joined by \'.
func shellUnquote(s string) (string, error) {
	var b strings.Builder
	for len(s) > 0 {
		switch {
		case strings.HasPrefix(s, `\'`):
			b.WriteByte('\'')
			s = s[2:]
		case s[0] == '\'':
			end := strings.IndexByte(s[1:], '\'')
			if end < 0 {
				return "", errors.New("unterminated quote")
			}
			b.WriteString(s[1 : 1+end])
			s = s[2+end:]
		default:
			return "", errors.New("value must be single-quoted")
		}
	}
	return b.String(), nil
}

// ApplyOptions configures Apply.
type ApplyOptions struct {
	// StagingDir holds the staged files and the request. Required.
	StagingDir string
	// Paths are where the files are installed. Required.
	Paths config.BootstrapFiles
	// Unit is the sidecar's systemd unit. Required.
	Unit string
	// Systemctl runs `systemctl <verb> <unit>`. Required.
	Systemctl func(ctx context.Context, verb, unit string) error
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// HostDNS, when set, is the host resolver's mesh DNS configuration:
	// installed on RequestDNSOn, removed before every restart and stop, so
	// the host never asks a sidecar that is not running. Nil: the host's
	// resolver is left alone and RequestDNSOn is refused.
	HostDNS *HostDNS
}

// HostDNS is what Apply needs to point the host's resolver at the sidecar.
type HostDNS struct {
	// Link is the sidecar's resolver link (hostdns.NewLink).
	Link hostdns.Link
	// Options run ip, resolvectl and systemctl.
	Options hostdns.Options
	// HasResolved reports whether systemd-resolved runs here. Default
	// hostdns.HasResolved.
	HasResolved func() bool
}

// disableHostDNS removes the host's mesh DNS configuration, if any.
func disableHostDNS(ctx context.Context, h *HostDNS, log *slog.Logger) error {
	if h == nil {
		return nil
	}
	changed, err := hostdns.Disable(ctx, h.Options, h.Link)
	if err != nil {
		return fmt.Errorf("host resolver: %w", err)
	}
	if changed {
		log.Info("host resolver no longer sends mesh domains to the sidecar")
	}
	return nil
}

// enableHostDNS installs the host's mesh DNS configuration.
func enableHostDNS(ctx context.Context, h *HostDNS, log *slog.Logger) error {
	if h == nil {
		return errors.New("dns-on: the sidecar's DNS proxy is off (sidecar.dns.enabled: false)")
	}
	has := h.HasResolved
	if has == nil {
		has = hostdns.HasResolved
	}
	if !has() {
		log.Info("no systemd-resolved on this host: configure the resolver to send mesh domains to the sidecar (docs/dns.md)")
		return nil
	}
	changed, err := hostdns.Enable(ctx, h.Options, h.Link)
	if err != nil {
		return fmt.Errorf("host resolver: %w", err)
	}
	log.Info("host resolver sends mesh domains to the sidecar", "link", h.Link.Name, "created", changed, "domains", h.Link.Domains)
	return nil
}

// Apply acts on the staged request, as root: for restart it validates the
// staged cluster.env, mesh config and root certificate, removes the host
// resolver's mesh DNS configuration, installs canonical copies (0644) at
// the upstream paths and restarts the unit; for stop it removes the mesh
// DNS configuration and stops the unit; for dns-on it installs the mesh DNS
// configuration (HostDNS); for roots it installs the staged root
// certificate alone (a rotated bundle, no restart). It returns the action
// taken. Staged files are read
// through an os.Root, so a symbolic link out of the staging directory is
// refused; nothing is installed unless all three files are valid.
func Apply(ctx context.Context, o ApplyOptions) (Action, error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	root, err := os.OpenRoot(o.StagingDir)
	if err != nil {
		return "", fmt.Errorf("staging directory: %w", err)
	}
	defer func() { _ = root.Close() }()
	req, err := readLimited(root, RequestFile, maxRequest)
	if err != nil {
		return "", err
	}
	verb, _, _ := strings.Cut(strings.TrimSpace(string(req)), " ")
	switch Action(verb) {
	case RequestDNSOn:
		return RequestDNSOn, enableHostDNS(ctx, o.HostDNS, log)
	case RequestStop:
		if err := disableHostDNS(ctx, o.HostDNS, log); err != nil {
			log.Error("cannot remove the host resolver's mesh DNS configuration; stopping the sidecar anyway", "error", err.Error())
		}
		if err := o.Systemctl(ctx, "stop", o.Unit); err != nil {
			return RequestStop, fmt.Errorf("stop %s: %w", o.Unit, err)
		}
		log.Info("sidecar stopped", "unit", o.Unit)
		return RequestStop, nil
	case RequestRoots:
		return RequestRoots, installStagedRoots(root, o.Paths.RootCert, log)
	case RequestRestart:
	default:
		return "", fmt.Errorf("request %q: want restart, stop, dns-on or roots", verb)
	}
	files, err := readStaged(root)
	if err != nil {
		return RequestRestart, err
	}
	if err := disableHostDNS(ctx, o.HostDNS, log); err != nil {
		return RequestRestart, err
	}
	for _, w := range []struct {
		path string
		data []byte
	}{{o.Paths.ClusterEnv, files.env}, {o.Paths.MeshConfig, files.mesh}, {o.Paths.RootCert, files.root}} {
		if err := WriteAtomic(w.path, w.data, 0o644); err != nil {
			return RequestRestart, err
		}
	}
	if err := o.Systemctl(ctx, "restart", o.Unit); err != nil {
		return RequestRestart, fmt.Errorf("restart %s: %w", o.Unit, err)
	}
	log.Info("sidecar bootstrap installed; sidecar restarted", "unit", o.Unit, "clusterEnv", o.Paths.ClusterEnv,
		"meshConfig", o.Paths.MeshConfig, "rootCert", o.Paths.RootCert)
	return RequestRestart, nil
}

// installStagedRoots installs a canonical copy of the staged root
// certificate at path when it differs from what is there.
func installStagedRoots(root *os.Root, path string, log *slog.Logger) error {
	raw, err := readLimited(root, StagedRootCert, maxStagedFile)
	if err != nil {
		return err
	}
	certs, err := canonicalCerts(raw)
	if err != nil {
		return fmt.Errorf("staged root certificate: %w", err)
	}
	changed, err := installRoots(path, certs)
	if err != nil {
		return err
	}
	if changed {
		log.Info("root certificates installed; the sidecar uses them for its next connection", "rootCert", path)
	}
	return nil
}

// installRoots writes certs (canonical PEM) at path unless path holds them
// already, and reports whether it wrote.
func installRoots(path string, certs []byte) (bool, error) {
	if installed(path, certs) {
		return false, nil
	}
	if err := WriteAtomic(path, certs, 0o644); err != nil {
		return false, err
	}
	return true, nil
}

// installed reports whether path holds the certificates certs (canonical
// PEM), in whatever PEM encoding.
func installed(path string, certs []byte) bool {
	cur, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	canon, err := canonicalCerts(cur)
	return err == nil && bytes.Equal(canon, certs)
}

type stagedFiles struct{ env, mesh, root []byte }

// readStaged reads and canonicalizes the three staged files.
func readStaged(root *os.Root) (*stagedFiles, error) {
	var out stagedFiles
	raw, err := readLimited(root, StagedClusterEnv, maxStagedFile)
	if err != nil {
		return nil, err
	}
	vars, err := ParseClusterEnv(raw)
	if err != nil {
		return nil, fmt.Errorf("staged %w", err)
	}
	if out.env, err = renderEnv(vars); err != nil {
		return nil, err
	}
	if raw, err = readLimited(root, StagedMeshConfig, maxStagedFile); err != nil {
		return nil, err
	}
	var mesh struct {
		DefaultConfig map[string]any `json:"defaultConfig"`
	}
	if err := yaml.UnmarshalStrict(raw, &mesh); err != nil {
		return nil, fmt.Errorf("staged mesh config: %w", err)
	}
	if out.mesh, err = yaml.Marshal(map[string]any{"defaultConfig": mesh.DefaultConfig}); err != nil {
		return nil, fmt.Errorf("staged mesh config: %w", err)
	}
	if raw, err = readLimited(root, StagedRootCert, maxStagedFile); err != nil {
		return nil, err
	}
	if out.root, err = canonicalCerts(raw); err != nil {
		return nil, fmt.Errorf("staged root certificate: %w", err)
	}
	return &out, nil
}

// canonicalCerts re-encodes PEM data that holds only X.509 certificates.
func canonicalCerts(data []byte) ([]byte, error) {
	var out bytes.Buffer
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %q, want CERTIFICATE", block.Type)
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return nil, err
		}
		_ = pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: block.Bytes})
	}
	if len(bytes.TrimSpace(data)) > 0 || out.Len() == 0 {
		return nil, errors.New("want one or more PEM certificates and nothing else")
	}
	return out.Bytes(), nil
}

// readLimited reads name from root, refusing anything but a regular file
// of at most limit bytes.
func readLimited(root *os.Root, name string, limit int64) ([]byte, error) {
	f, err := root.Open(name)
	if err != nil {
		return nil, fmt.Errorf("staged %s: %w", name, err)
	}
	defer func() { _ = f.Close() }()
	info, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("staged %s: %w", name, err)
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("staged %s: not a regular file", name)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("staged %s: %w", name, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("staged %s: larger than %d bytes", name, limit)
	}
	return data, nil
}

// SystemctlCommand is the Systemctl of ApplyOptions in production.
func SystemctlCommand(ctx context.Context, verb, unit string) error {
	return Run(ctx, []string{"systemctl", verb, unit})
}
