//go:build install

package install

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
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
	tree, postinst := istioSidecarTree(t)
	arch := runtime.GOARCH
	control := []struct {
		dst  string
		data []byte
		mode os.FileMode
	}{
		{dst: "DEBIAN/postinst", data: postinst, mode: 0o755},
		{dst: "DEBIAN/conffiles", data: []byte(strings.Join(istioSidecarConfigFiles, "\n") + "\n"), mode: 0o644},
		{dst: "DEBIAN/control", data: []byte(fmt.Sprintf("Package: istio-sidecar\nVersion: %s\nArchitecture: %s\nMaintainer: istio@istio.io\n"+
			"Depends: iproute2, hostname\nHomepage: http://istio.io\nDescription: Istio Sidecar (test build of test/install)\n", IstioSidecarVersion, arch)), mode: 0o644},
	}
	for _, f := range control {
		writeTreeFile(t, filepath.Join(tree, f.dst), f.data, f.mode)
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

// BuildIstioSidecarRPM writes rpm/<arch>/istio-sidecar.rpm (the host's
// architecture) under dir: the RPM of BuildIstioSidecarDeb's files, as
// packaging.mk's fpm lays it out (postinst.sh after install, the two
// configuration files), built with the pinned nfpm of test/tools/nfpm and
// signed with signingKey (an armored OpenPGP private key), as
// docs/local-repository.md asks of an operator adding Istio's RPM: dnf
// with gpgcheck=1 refuses an RPM the repository key did not sign. Beyond
// the Debian package's differences it has no Requires at all (Istio's:
// iproute, iptables, sudo, hostname): the simulated VM is a Debian root
// whose rpm database holds no package that could provide them.
func BuildIstioSidecarRPM(t *testing.T, dir, signingKey string) string {
	t.Helper()
	tree, postinst := istioSidecarTree(t)
	work := t.TempDir()
	postinstFile := filepath.Join(work, "postinst.sh")
	writeTreeFile(t, postinstFile, postinst, 0o755)
	var contents strings.Builder
	err := filepath.Walk(tree, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		dst := "/" + strings.TrimPrefix(p, tree+"/")
		kind := ""
		if slices.Contains(istioSidecarConfigFiles, dst) {
			kind = "\n  type: config|noreplace"
		}
		fmt.Fprintf(&contents, "- src: %s\n  dst: %s%s\n  file_info:\n    mode: 0%o\n", p, dst, kind, fi.Mode().Perm())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`name: istio-sidecar
arch: %s
platform: linux
version: %s
maintainer: istio@istio.io
vendor: istio.io
homepage: http://istio.io
license: Apache
description: Istio Sidecar (test build of test/install)
contents:
%sscripts:
  postinstall: %s
rpm:
  signature:
    key_file: %s
`, runtime.GOARCH, IstioSidecarVersion, contents.String(), postinstFile, signingKey)
	configFile := filepath.Join(work, "nfpm.yaml")
	writeTreeFile(t, configFile, []byte(config), 0o644)
	out := filepath.Join(dir, "rpm", runtime.GOARCH, "istio-sidecar.rpm")
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "go", "run", "github.com/goreleaser/nfpm/v2/cmd/nfpm",
		"package", "--config", configFile, "--packager", "rpm", "--target", out)
	cmd.Dir = filepath.Join(root, "test", "tools", "nfpm")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nfpm (test/tools/nfpm): %v\n%s\n%s", err, b, config)
	}
	return out
}

// istioSidecarConfigFiles are the package's configuration files, as
// packaging.mk's --config-files names them.
var istioSidecarConfigFiles = []string{"/var/lib/istio/envoy/envoy_bootstrap_tmpl.json", "/var/lib/istio/envoy/sidecar.env"}

// istioSidecarTree writes the istio-sidecar package's files (see
// BuildIstioSidecarDeb) under a new directory, as they are installed, and
// returns it with Istio's postinst.sh.
func istioSidecarTree(t *testing.T) (tree string, postinst []byte) {
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
	tree = t.TempDir()
	pkg := filepath.Join(istio, "tools", "packaging")
	sidecarEnv, err := os.ReadFile(filepath.Join(pkg, "common", "sidecar.env"))
	if err != nil {
		t.Fatal(err)
	}
	sidecarEnv = append(sidecarEnv, []byte("\n# STAND-IN (test/install): no Envoy binary in this package.\nDISABLE_ENVOY=true\n")...)
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
	}
	for _, f := range files {
		data := f.data
		if data == nil {
			if data, err = os.ReadFile(f.src); err != nil {
				t.Fatal(err)
			}
		}
		writeTreeFile(t, filepath.Join(tree, f.dst), data, f.mode)
	}
	if postinst, err = os.ReadFile(filepath.Join(pkg, "postinst.sh")); err != nil {
		t.Fatal(err)
	}
	return tree, postinst
}

// writeTreeFile writes data to p with mode (past the umask), making its
// directories.
func writeTreeFile(t *testing.T, p string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
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
