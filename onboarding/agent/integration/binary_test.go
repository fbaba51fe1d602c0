package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/testenv"
	"github.com/embark-mesh/embark/test/vmsim"
)

// The built cmd/onboarding-agent binary, with its configuration files and
// flags, onboards and unregisters on SIGTERM.
// buildAgent builds cmd/onboarding-agent as version v9.9.9-test.
func buildAgent(t *testing.T) string {
	t.Helper()
	repo, err := testenv.RepoRoot()
	must(t, err)
	bin := filepath.Join(t.TempDir(), "onboarding-agent")
	build := exec.CommandContext(t.Context(), "go", "build", "-ldflags", "-X github.com/embark-mesh/embark/version.version=v9.9.9-test", "-o", bin, "./cmd/onboarding-agent")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func TestBinaryOnboardsAndUnregistersOnSIGTERM(t *testing.T) {
	bin := buildAgent(t)

	w := newWorld(t)
	w.allow()
	w.startEndpoint()
	root := t.TempDir()
	agentFile, onboardingFile := w.agentConfig(root, agentFiles{})
	// Empty config fails with the field named.
	bad := filepath.Join(root, "bad.yaml")
	must(t, os.WriteFile(bad, []byte("apiVersion: config.agent.onboarding.tetrate.io/v1alpha1\nkind: AgentConfiguration\nhost: {platform: mainframe}\n"), 0o600))
	// Bounded: an agent that accepted the configuration would run on.
	badCtx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(badCtx, bin, "--agent-config", bad, "--onboarding-config", onboardingFile).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "host.platform") {
		t.Errorf("bad configuration: %v, %s; want an error naming host.platform", err, out)
	}

	tokenFile := filepath.Join(root, "flag-token")
	logs := &vmsim.SyncBuffer{}
	cmd := exec.Command(bin, "--agent-config", agentFile, "--onboarding-config", onboardingFile, "--token", tokenFile)
	cmd.Stdout, cmd.Stderr = logs, logs
	must(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("agent output:\n%s", logs.String())
		}
	})
	fixtures.Eventually(t, 60*time.Second, "registration created and sidecar restarted", func() bool {
		return len(w.registrations()) == 1 && countLines(filepath.Join(root, "restarts")) == 1
	})
	if v := w.registrations()[0].Spec.Registration.Agent.Version; v != "v9.9.9-test" {
		t.Errorf("agent version %q", v)
	}
	if b, err := os.ReadFile(tokenFile); err != nil || strings.Count(string(b), ".") != 2 {
		t.Errorf("--token file: %v", err)
	}
	if !strings.Contains(logs.String(), "platform: aws EC2 detected") {
		t.Errorf("detection not logged:\n%s", logs.String())
	}

	must(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("agent exited with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not exit after SIGTERM")
	}
	if n := len(w.registrations()); n != 0 {
		t.Errorf("%d registrations after SIGTERM, want 0", n)
	}
	if countLines(filepath.Join(root, "stops")) != 1 {
		t.Error("sidecar not stopped")
	}
}
