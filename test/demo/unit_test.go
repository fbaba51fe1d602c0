package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestParseClusterEnv(t *testing.T) {
	env, err := parseClusterEnv([]byte(`# Written by onboarding-agent from registration bookinfo/r. Do not edit.
CANONICAL_SERVICE='ratings'
ISTIO_METAJSON_LABELS='{"app":"ratings","class":"vm"}'
QUOTED='it'\''s'
EMPTY=''
BARE=plain

`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"CANONICAL_SERVICE": "ratings", "ISTIO_METAJSON_LABELS": `{"app":"ratings","class":"vm"}`, "QUOTED": "it's", "EMPTY": "", "BARE": "plain"}
	if err := compare("variable", "value", env, want); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"NOVALUE", "=x", "A='open", "A='x'y", "A B='x'", "A='x'\\'"} {
		if _, err := parseClusterEnv([]byte(bad + "\n")); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestParseMeshConfig(t *testing.T) {
	pc, err := parseMeshConfig([]byte(`defaultConfig:
  discoveryAddress: 127.0.0.1:15012
  readinessProbe:
    httpGet:
      path: /ready
      port: 9080
    periodSeconds: 1
`))
	if err != nil {
		t.Fatal(err)
	}
	if pc.GetDiscoveryAddress() != "127.0.0.1:15012" || pc.GetReadinessProbe().GetHttpGet().GetPort() != 9080 || pc.GetReadinessProbe().GetPeriodSeconds() != 1 {
		t.Errorf("ProxyConfig %v", pc)
	}
	if pc, err := parseMeshConfig([]byte("{}\n")); err != nil || pc.GetDiscoveryAddress() != "" {
		t.Errorf("empty mesh config: %v, %v", pc, err)
	}
	for _, bad := range []string{"defaultConfig: [1]\n", "defaultConfig:\n  noSuchField: 1\n", "a: b: c\n"} {
		if _, err := parseMeshConfig([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// The onboarding agent's restart and stop commands reach the unit and
// report its failures through the exit code.
func TestSidecarUnit(t *testing.T) {
	dir, err := os.MkdirTemp("", "unit-") // short: a unix socket path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "sidecar.sock")
	var restarts, stops int
	failRestart := false
	u, err := startSidecarUnit(sock, func() error {
		restarts++
		if failRestart {
			return errors.New("pilot-agent exited\nat once")
		}
		return nil
	}, func() error {
		stops++
		newDemoTB(t.Context(), os.Stderr, dir).Fatalf("fatal in a helper")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer u.close()

	if code := systemctl([]string{"--socket", sock, "restart"}); code != 0 || restarts != 1 {
		t.Errorf("restart: exit %d, %d restarts", code, restarts)
	}
	failRestart = true
	if code := systemctl([]string{"--socket", sock, "restart"}); code != 1 || restarts != 2 {
		t.Errorf("failed restart: exit %d, %d restarts", code, restarts)
	}
	if code := systemctl([]string{"--socket", sock, "stop"}); code != 1 || stops != 1 {
		t.Errorf("stop failing fatally: exit %d, %d stops", code, stops)
	}
	if code := systemctl([]string{"--socket", sock, "reload"}); code != 1 {
		t.Errorf("unknown verb: exit %d", code)
	}
	if code := systemctl([]string{"restart"}); code != 2 {
		t.Errorf("no socket: exit %d", code)
	}
	if code := systemctl([]string{"--socket", filepath.Join(dir, "none.sock"), "restart"}); code != 1 {
		t.Errorf("no unit: exit %d", code)
	}
}
