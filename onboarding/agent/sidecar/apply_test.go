package sidecar

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/agent/hostdns"
)

func selfSignedPEM(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "root"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

type systemctlCalls []string

func (c *systemctlCalls) run(_ context.Context, verb, unit string) error {
	*c = append(*c, verb+" "+unit)
	return nil
}

func installPaths(dir string) config.BootstrapFiles {
	return config.BootstrapFiles{
		ClusterEnv: filepath.Join(dir, "var/lib/istio/envoy/cluster.env"),
		MeshConfig: filepath.Join(dir, "etc/istio/config/mesh"),
		RootCert:   filepath.Join(dir, "etc/certs/embark-root-cert.pem"),
		Token:      filepath.Join(dir, "var/run/secrets/tokens/istio-token"),
	}
}

// The agent stages, the root side installs and restarts; then a stop.
func TestStageAndApply(t *testing.T) {
	dir, staging := t.TempDir(), t.TempDir()
	paths := installPaths(dir)
	boot := testBootstrap()
	boot.RootCertificates = selfSignedPEM(t)
	f := &Files{Paths: paths, Env: EnvOptions{CAAddress: "istiod-ca.example:15012"}}
	id := Identity{Namespace: "bookinfo", RegistrationName: "ratings-x"}
	if err := f.Stage(staging, id, boot); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(paths.ClusterEnv); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Stage wrote the installed cluster.env: %v", err)
	}
	if b, err := os.ReadFile(paths.Token); err != nil || string(b) != "sidecar.jwt.token" {
		t.Fatalf("token not written in place: %q %v", b, err)
	}
	if err := Request(staging, RequestRestart, 1); err != nil {
		t.Fatal(err)
	}
	var calls systemctlCalls
	opts := ApplyOptions{StagingDir: staging, Paths: paths, Unit: "istio.service", Systemctl: calls.run}
	action, err := Apply(t.Context(), opts)
	if err != nil || action != RequestRestart {
		t.Fatalf("Apply = %q, %v", action, err)
	}
	want, err := ClusterEnv(id, boot, envWithRoot(f.Env, paths.RootCert))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{paths.ClusterEnv, string(want)},
		{paths.RootCert, string(boot.RootCertificates)},
	} {
		got, err := os.ReadFile(c.path)
		if err != nil || string(got) != c.want {
			t.Errorf("%s = %q, %v; want %q", c.path, got, err, c.want)
		}
		if info, _ := os.Stat(c.path); info.Mode().Perm() != 0o644 {
			t.Errorf("%s mode %v, want 0644 (istio-proxy reads it)", c.path, info.Mode())
		}
	}
	if mesh, _ := os.ReadFile(paths.MeshConfig); !strings.Contains(string(mesh), "readinessProbe") {
		t.Errorf("mesh config %q", mesh)
	}
	if !strings.Contains(string(want), "CA_ADDR='istiod-ca.example:15012'") {
		t.Errorf("caAddress not used: %s", want)
	}
	if err := Request(staging, RequestStop, 2); err != nil {
		t.Fatal(err)
	}
	if action, err := Apply(t.Context(), opts); err != nil || action != RequestStop {
		t.Fatalf("Apply = %q, %v", action, err)
	}
	if got := strings.Join(calls, ","); got != "restart istio.service,stop istio.service" {
		t.Errorf("systemctl calls %q", got)
	}
}

// What a compromised or buggy agent could stage is refused before anything
// is installed or restarted.
func TestApplyRefusesBadStagedFiles(t *testing.T) {
	good, err := ClusterEnv(Identity{Namespace: "ns", RegistrationName: "vm"}, testBootstrap(), EnvOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		env     string
		mesh    string
		root    string
		link    bool
		request string
		wantErr string
	}{
		{name: "command in cluster.env", env: string(good) + "PILOT_ADDRESS=$(id)\n", wantErr: "repeated"},
		{name: "unknown key", env: string(good) + "ISTIO_BIN_BASE='/tmp'\n", wantErr: `key "ISTIO_BIN_BASE" is not allowed`},
		{name: "unquoted value", env: strings.Replace(string(good), "POD_NAME='vm'", "POD_NAME=vm;id", 1), wantErr: "single-quoted"},
		{name: "TPROXY makes istio-start.sh run pilot-agent as root", env: strings.Replace(string(good), "ISTIO_INBOUND_INTERCEPTION_MODE='NONE'", "ISTIO_INBOUND_INTERCEPTION_MODE='TPROXY'", 1), wantErr: "ISTIO_INBOUND_INTERCEPTION_MODE"},
		{name: "iptables on", env: strings.Replace(string(good), "ISTIO_CUSTOM_IP_TABLES='true'", "ISTIO_CUSTOM_IP_TABLES='false'", 1), wantErr: "ISTIO_CUSTOM_IP_TABLES"},
		{name: "not a certificate", root: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", wantErr: "root certificate"},
		{name: "extra mesh field", mesh: "defaultConfig: {}\nrootNamespace: x\n", wantErr: "mesh config"},
		{name: "symlink out of the staging directory", link: true, wantErr: "staged cluster.env"},
		{name: "unknown request", request: "chmod 4755 /bin/sh\n", wantErr: "want restart, stop, dns-on or roots"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, staging := t.TempDir(), t.TempDir()
			boot := testBootstrap()
			boot.RootCertificates = selfSignedPEM(t)
			paths := installPaths(dir)
			if err := (&Files{Paths: paths}).Stage(staging, Identity{Namespace: "ns", RegistrationName: "vm"}, boot); err != nil {
				t.Fatal(err)
			}
			write := func(name, data string) {
				if data != "" {
					if err := os.WriteFile(filepath.Join(staging, name), []byte(data), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			write(StagedClusterEnv, tt.env)
			write(StagedMeshConfig, tt.mesh)
			write(StagedRootCert, tt.root)
			if tt.link {
				secret := filepath.Join(dir, "secret")
				if err := os.WriteFile(secret, good, 0o600); err != nil {
					t.Fatal(err)
				}
				_ = os.Remove(filepath.Join(staging, StagedClusterEnv))
				if err := os.Symlink(secret, filepath.Join(staging, StagedClusterEnv)); err != nil {
					t.Fatal(err)
				}
			}
			req := tt.request
			if req == "" {
				req = "restart 1\n"
			}
			write(RequestFile, req)
			var calls systemctlCalls
			_, err := Apply(t.Context(), ApplyOptions{StagingDir: staging, Paths: paths, Unit: "istio.service", Systemctl: calls.run})
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Apply error %v, want %q", err, tt.wantErr)
			}
			if len(calls) > 0 {
				t.Errorf("systemctl ran: %v", calls)
			}
			if _, err := os.Stat(paths.ClusterEnv); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cluster.env installed despite the error")
			}
		})
	}
}

func TestParseClusterEnvRoundTrip(t *testing.T) {
	boot := testBootstrap()
	boot.Labels["odd"] = `a'b"c$(id)` + "`x`"
	env, err := ClusterEnv(Identity{Namespace: "ns", RegistrationName: "vm"}, boot, EnvOptions{Revision: "canary"})
	if err != nil {
		t.Fatal(err)
	}
	vars, err := ParseClusterEnv(env)
	if err != nil {
		t.Fatal(err)
	}
	again, err := renderEnv(vars)
	if err != nil || string(again) != string(env) {
		t.Errorf("round trip changed cluster.env:\n%s\n%s (%v)", env, again, err)
	}
	if !strings.Contains(vars["ISTIO_METAJSON_LABELS"], `a'b\"c$(id)`) {
		t.Errorf("labels %q", vars["ISTIO_METAJSON_LABELS"])
	}
}

// envWithRoot is what Files passes to ClusterEnv: opts with the
// installed root certificate's path.
func envWithRoot(opts EnvOptions, rootCert string) EnvOptions {
	opts.RootCert = rootCert
	return opts
}

// The host resolver's mesh DNS link exists only after dns-on: it is
// deleted before every restart and stop of the sidecar.
func TestApplyHostDNS(t *testing.T) {
	dir, staging := t.TempDir(), t.TempDir()
	paths := installPaths(dir)
	boot := testBootstrap()
	boot.RootCertificates = selfSignedPEM(t)
	f := &Files{Paths: paths, Env: EnvOptions{DNSAddress: "127.0.0.1:15053"}}
	if err := f.Stage(staging, Identity{Namespace: "bookinfo", RegistrationName: "ratings-x"}, boot); err != nil {
		t.Fatal(err)
	}
	link, err := hostdns.NewLink(hostdns.DefaultLinkName, hostdns.DefaultLinkAddress, "127.0.0.1:15053", []string{"cluster.local"})
	if err != nil {
		t.Fatal(err)
	}
	var calls systemctlCalls
	// The link as ip shows it; configured counts resolvectl's server settings.
	exists, configured := false, 0
	run := func(_ context.Context, argv ...string) ([]byte, error) {
		switch cmd := strings.Join(argv, " "); {
		case cmd == "ip -o link show" && exists:
			return []byte("7: mesh-dns0: <BROADCAST,NOARP,UP,LOWER_UP> mtu 1500\\    alias " + hostdns.LinkAlias + "\n"), nil
		case cmd == "ip link add mesh-dns0 type dummy":
			exists = true
		case cmd == "ip link delete dev mesh-dns0":
			exists = false
		case strings.HasPrefix(cmd, "resolvectl dns mesh-dns0 127.0.0.1:15053"):
			configured++
		}
		return nil, nil
	}
	opts := ApplyOptions{StagingDir: staging, Paths: paths, Unit: "istio.service", Systemctl: calls.run,
		HostDNS: &HostDNS{Link: link, Options: hostdns.Options{Run: run, LegacyDropIn: filepath.Join(dir, "legacy.conf")},
			HasResolved: func() bool { return true }}}
	steps := []struct {
		action         Action
		wantLink       bool
		wantConfigured int
		wantCall       string
	}{
		{RequestRestart, false, 0, "restart istio.service"},
		{RequestDNSOn, true, 1, ""},
		{RequestRestart, false, 1, "restart istio.service"},
		{RequestDNSOn, true, 2, ""},
		{RequestStop, false, 2, "stop istio.service"},
	}
	for i, s := range steps {
		calls = nil
		if err := Request(staging, s.action, uint64(i)); err != nil {
			t.Fatal(err)
		}
		got, err := Apply(t.Context(), opts)
		if err != nil || got != s.action {
			t.Fatalf("step %d %s: %s, %v", i, s.action, got, err)
		}
		if exists != s.wantLink || configured != s.wantConfigured {
			t.Errorf("step %d %s: link present %v, configured %d times; want %v, %d", i, s.action, exists, configured, s.wantLink, s.wantConfigured)
		}
		if s.wantCall != "" && (len(calls) != 1 || calls[0] != s.wantCall) {
			t.Errorf("step %d %s: systemctl %v, want %q", i, s.action, calls, s.wantCall)
		}
	}
	// With the DNS proxy off there is nothing to point the resolver at.
	opts.HostDNS = nil
	if err := Request(staging, RequestDNSOn, 99); err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(t.Context(), opts); err == nil || !strings.Contains(err.Error(), "sidecar.dns.enabled") {
		t.Errorf("dns-on without HostDNS: %v, want an error naming sidecar.dns.enabled", err)
	}
}

// New roots reach a running VM without a restart: written at their path
// (direct) or staged with a roots request that Apply installs alone. The
// same roots again change nothing; anything but certificates is refused
// and the installed roots stay.
func TestInstallRoots(t *testing.T) {
	ca1, ca2 := selfSignedPEM(t), selfSignedPEM(t)
	both := append(append([]byte{}, ca1...), ca2...)
	for _, tc := range []struct {
		name    string
		install func(t *testing.T, f *Files, staging string, roots []byte) (bool, error)
	}{
		{"direct", func(_ *testing.T, f *Files, _ string, roots []byte) (bool, error) { return f.InstallRoots(roots) }},
		{"staged", func(t *testing.T, f *Files, staging string, roots []byte) (bool, error) {
			changed, err := f.StageRoots(staging, roots)
			if err != nil || !changed {
				return changed, err
			}
			if err := Request(staging, RequestRoots, 7); err != nil {
				t.Fatal(err)
			}
			var calls systemctlCalls
			action, err := Apply(t.Context(), ApplyOptions{StagingDir: staging, Paths: f.Paths, Unit: "istio.service", Systemctl: calls.run})
			if action != RequestRoots || len(calls) != 0 {
				t.Errorf("Apply = %q, systemctl %q; want roots and no restart", action, calls)
			}
			return true, err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, staging := t.TempDir(), t.TempDir()
			f := &Files{Paths: installPaths(dir)}
			if err := WriteAtomic(f.Paths.RootCert, ca1, 0o644); err != nil {
				t.Fatal(err)
			}
			for i, step := range []struct {
				roots   []byte
				changed bool
				wantErr bool
				want    []byte
			}{
				{roots: ca1, want: ca1},
				{roots: both, changed: true, want: both},
				{roots: both, want: both},
				{roots: []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), wantErr: true, want: both},
				{roots: append(append([]byte{}, ca2...), "trailing"...), wantErr: true, want: both},
				{roots: ca2, changed: true, want: ca2},
			} {
				changed, err := tc.install(t, f, staging, step.roots)
				if (err != nil) != step.wantErr || changed != step.changed {
					t.Errorf("step %d: changed %v, err %v; want changed %v, error %v", i, changed, err, step.changed, step.wantErr)
				}
				got, err := os.ReadFile(f.Paths.RootCert)
				if err != nil || string(got) != string(step.want) {
					t.Errorf("step %d: installed %q, %v", i, got, err)
				}
			}
			if info, err := os.Stat(f.Paths.RootCert); err != nil || info.Mode().Perm() != 0o644 {
				t.Errorf("installed roots: %v, %v; want mode 0644", info, err)
			}
		})
	}
}
