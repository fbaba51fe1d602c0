package integration

import (
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// The endpoint's local repository, as the VM install guide's commands use it:
// curl -fLO of every package and its .sha256 over the endpoint's HTTPS (its
// serving certificate and host name), then sha256sum --check.
func TestEndpointServesTheLocalRepository(t *testing.T) {
	for _, tool := range []string{"curl", "sha256sum"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (apt-get install -y curl): %v", tool, err)
		}
	}
	w := newWorld(t)
	paths := []string{
		"/install/deb/amd64/onboarding-agent.deb", "/install/deb/amd64/istio-sidecar.deb",
		"/install/rpm/amd64/onboarding-agent.rpm", "/install/rpm/amd64/istio-sidecar.rpm",
		"/install/deb/arm64/onboarding-agent.deb", "/install/deb/arm64/istio-sidecar.deb",
		"/install/rpm/arm64/onboarding-agent.rpm", "/install/rpm/arm64/istio-sidecar.rpm",
		"/install/istio-sidecar/canary/deb/amd64/istio-sidecar.deb", "/install/istio-sidecar/canary/rpm/amd64/istio-sidecar.rpm",
	}
	for _, p := range paths {
		f := filepath.Join(w.repoDir, strings.TrimPrefix(p, "/install/"))
		must(t, os.MkdirAll(filepath.Dir(f), 0o755))
		must(t, os.WriteFile(f, []byte(strings.Repeat(p, 1000)), 0o644))
	}
	w.startEndpoint()
	_, port, err := net.SplitHostPort(w.repoAddr)
	must(t, err)
	base := "https://" + endpointHost + ":" + port
	curl := func(dir string, args ...string) (string, error) {
		cmd := exec.CommandContext(t.Context(), "curl", append([]string{"--silent", "--show-error", "--cacert", w.caFile,
			"--resolve", endpointHost + ":" + port + ":127.0.0.1"}, args...)...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, p := range paths {
		work := t.TempDir()
		for _, u := range []string{p, p + ".sha256"} {
			if out, err := curl(work, "-fLO", base+u); err != nil {
				t.Fatalf("curl -fLO %s: %v\n%s", u, err, out)
			}
		}
		cmd := exec.CommandContext(t.Context(), "sha256sum", "--check", path.Base(p)+".sha256")
		cmd.Dir = work
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), ": OK") {
			t.Errorf("sha256sum --check %s: %v\n%s", p, err, out)
		}
	}
	out, err := curl(t.TempDir(), "--path-as-is", "-o", "/dev/null", "-w", "%{http_code}", base+"/install/deb/amd64/../../../endpoint.yaml")
	if err != nil || out != "404" {
		t.Errorf("path outside the repository: %q %v, want 404", out, err)
	}
}
