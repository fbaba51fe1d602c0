package istioagent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/embark-mesh/embark/test/testenv"
)

// BinaryPath finds one of the binaries test/tools/install.sh builds (`make
// testenv`): in dir when set, else in $KUBEBUILDER_ASSETS, else in bin/testenv
// of the repository root.
func BinaryPath(name, dir string) (string, error) {
	dir, err := testenv.AssetsDir(dir)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("%s missing in %s: run `make testenv`: %w", name, dir, err)
	}
	if fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s in %s is not executable: run `make testenv`", name, dir)
	}
	return path, nil
}

// Istioctl runs the istioctl built by `make testenv` with args and returns its
// standard output; the error carries its standard error. It runs with HOME in
// an empty temporary directory and KUBECONFIG pointing at a missing file, so it
// never reaches a developer's cluster: pass --xds-address, and -r (e.g.
// `istioctl proxy-status --xds-address HOST:PORT --plaintext -r default`), or
// it looks for a cluster.
func Istioctl(ctx context.Context, t testing.TB, args ...string) (string, error) {
	t.Helper()
	bin, err := BinaryPath("istioctl", "")
	if err != nil {
		return "", err
	}
	home := t.TempDir()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = home
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + home,
		"KUBECONFIG=" + filepath.Join(home, "no-kubeconfig"),
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("istioctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
