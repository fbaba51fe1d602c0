//go:build install

package install

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/embark-mesh/embark/test/testenv"
)

// IstioSidecarVersion is the version of the test's istio-sidecar package.
const IstioSidecarVersion = "1.30.0"

// BuildIstioSidecarDeb writes deb/<arch>/istio-sidecar.deb (the host's
// architecture) under dir: the package an operator adds to the endpoint's
// repository from a volume, built here the way Istio's
// tools/packaging/packaging.mk lays it out, from the pinned Istio module's
// own files (istio-start.sh, istio.service, sidecar.env,
// envoy_bootstrap.json, postinst.sh) and the real pilot-agent of
// bin/testenv, with dpkg-deb. It differs from Istio's in three labelled
// ways: no Envoy (none exists here: /usr/local/bin/envoy is a stand-in that
// only fails, sidecar.env sets DISABLE_ENVOY=true and something else plays
// Envoy on pilot-agent's XDS socket); no Depends on iptables and sudo (the VM runs no iptables rules,
// ISTIO_CUSTOM_IP_TABLES=true, and sudo is the VM's stand-in, which dpkg does
// not know as a package); no compression (as Istio's, and quick).
func BuildIstioSidecarDeb(t *testing.T, dir string) string {
	t.Helper()
	istio, err := istioModuleDir()
	if err != nil {
		t.Fatal(err)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	assets, err := testenv.AssetsDir(filepath.Join(root, "bin", "testenv"))
	if err != nil {
		t.Fatal(err)
	}
	tree := t.TempDir()
	pkg := filepath.Join(istio, "tools", "packaging")
	sidecarEnv, err := os.ReadFile(filepath.Join(pkg, "common", "sidecar.env"))
	if err != nil {
		t.Fatal(err)
	}
	sidecarEnv = append(sidecarEnv, []byte("\n# STAND-IN (test/install): no Envoy binary in this package.\nDISABLE_ENVOY=true\n")...)
	arch := runtime.GOARCH
	files := []struct {
		src  string
		data []byte
		dst  string
		mode os.FileMode
	}{
		{src: filepath.Join(assets, "pilot-agent"), dst: "usr/local/bin/pilot-agent", mode: 0o755},
		{data: []byte("#!/bin/sh\n# STAND-IN (test/install): no Envoy binary exists here.\necho 'envoy: stand-in of test/install, not Envoy' >&2\nexit 1\n"),
			dst: "usr/local/bin/envoy", mode: 0o755},
		{src: filepath.Join(pkg, "common", "istio-start.sh"), dst: "usr/local/bin/istio-start.sh", mode: 0o755},
		{src: filepath.Join(pkg, "common", "istio.service"), dst: "lib/systemd/system/istio.service", mode: 0o644},
		{src: filepath.Join(pkg, "common", "envoy_bootstrap.json"), dst: "var/lib/istio/envoy/envoy_bootstrap_tmpl.json", mode: 0o644},
		{data: sidecarEnv, dst: "var/lib/istio/envoy/sidecar.env", mode: 0o644},
		{src: filepath.Join(pkg, "postinst.sh"), dst: "DEBIAN/postinst", mode: 0o755},
		{data: []byte("/var/lib/istio/envoy/envoy_bootstrap_tmpl.json\n/var/lib/istio/envoy/sidecar.env\n"), dst: "DEBIAN/conffiles", mode: 0o644},
		{data: []byte(fmt.Sprintf("Package: istio-sidecar\nVersion: %s\nArchitecture: %s\nMaintainer: istio@istio.io\n"+
			"Depends: iproute2, hostname\nHomepage: http://istio.io\nDescription: Istio Sidecar (test build of test/install)\n", IstioSidecarVersion, arch)),
			dst: "DEBIAN/control", mode: 0o644},
	}
	for _, f := range files {
		data := f.data
		if data == nil {
			if data, err = os.ReadFile(f.src); err != nil {
				t.Fatal(err)
			}
		}
		p := filepath.Join(tree, f.dst)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "deb", arch, "istio-sidecar.deb")
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "dpkg-deb", "--root-owner-group", "-Znone", "--build", tree, out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb: %v\n%s", err, b)
	}
	return out
}

// istioModuleDir is the pinned Istio module's directory (test/tools/istio).
func istioModuleDir() (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, "test", "tools", "istio")
	list := func() string {
		cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/istio")
		cmd.Dir = dir
		out, _ := cmd.Output()
		return strings.TrimSpace(string(out))
	}
	if d := list(); d != "" {
		return d, nil
	}
	cmd := exec.Command("go", "mod", "download", "istio.io/istio")
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("the pinned Istio module: %w: %s", err, b)
	}
	if d := list(); d != "" {
		return d, nil
	}
	return "", fmt.Errorf("the pinned Istio module: go list -m istio.io/istio in %s found no directory", dir)
}
