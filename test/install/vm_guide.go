//go:build install

package install

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/embark-mesh/embark/test/testenv"
)

// ServeIMDS makes imdsURL (an awstest IMDS on the host's loopback) the
// VM network's instance metadata service: 169.254.169.254:80 inside the
// namespace, the link-local address the agent's AWS SDK asks, as on EC2.
func ServeIMDS(t *testing.T, n *Network, imdsURL string) {
	t.Helper()
	must(t, n.AddLocalAddress(t.Context(), "169.254.169.254/32"))
	l, err := n.Listen("tcp", "169.254.169.254:80")
	must(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go relayTCP(l, strings.TrimPrefix(imdsURL, "http://"))
}

// FollowGuide does on vm what docs/vm-install.md tells a Debian/Ubuntu
// operator to: installs servingCA as the CA the VM trusts for host
// (/usr/local/share/ca-certificates/embark.crt, update-ca-certificates),
// then runs the guide's blocks (guideSections) with EMBARK=host and
// EMBARK_KEYS=fingerprints, watching the final `journalctl -f` until the
// agent logs that it onboarded, and interrupting it then. It fails the test
// if a step fails or the key check does not pass, and returns the output.
func FollowGuide(t *testing.T, vm *VM, host string, servingCA []byte, fingerprints []string) string {
	t.Helper()
	return followGuide(t, vm, guideSections, host, servingCA, fingerprints)
}

// FollowRHELGuide is FollowGuide with the RHEL family's blocks
// (rhelGuideSections: dnf from the repository). The simulated VM is the
// host's Debian root with Debian's dnf, so two things a RHEL base system
// has are made first: /etc/yum.repos.d (RHEL's dnf owns it; Debian's
// package does not create it). The CA is installed as on Debian all the
// same: dnf's libcurl (through librepo) reads Debian's bundle here, and
// there is no update-ca-trust.
func FollowRHELGuide(t *testing.T, vm *VM, host string, servingCA []byte, fingerprints []string) string {
	t.Helper()
	if out, err := vm.Run(t.Context(), "mkdir -p /etc/yum.repos.d", nil); err != nil {
		t.Fatalf("the RHEL base system's /etc/yum.repos.d: %v\n%s", err, out)
	}
	return followGuide(t, vm, rhelGuideSections, host, servingCA, fingerprints)
}

func followGuide(t *testing.T, vm *VM, sections []string, host string, servingCA []byte, fingerprints []string) string {
	t.Helper()
	ctx := t.Context()
	must(t, vm.WriteFile("/usr/local/share/ca-certificates/embark.crt", servingCA, 0o644))
	if out, err := vm.Run(ctx, "sudo update-ca-certificates", nil); err != nil {
		t.Fatalf("update-ca-certificates: %v\n%s", err, out)
	}
	script, err := GuideScript(guidePath(t), host, fingerprints, sections...)
	must(t, err)
	t.Logf("the guide's blocks:\n%s", script)
	runCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	out, err := vm.RunUntil(runCtx, script, nil, func(out string) bool { return strings.Contains(out, "onboarded: sidecar bootstrap written") })
	t.Logf("the guide in the VM:\n%s", out)
	if err != nil {
		t.Fatalf("the guide's blocks failed: %v", err)
	}
	if !strings.Contains(out, "keys OK") {
		t.Fatal("the guide's repository key check did not print keys OK")
	}
	return out
}

// guidePath is docs/vm-install.md of this repository.
func guidePath(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	must(t, err)
	return filepath.Join(root, "docs", "vm-install.md")
}
