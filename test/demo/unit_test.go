package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/embark-mesh/embark/test/vmsim"
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

// The demo binary, run as systemctl, reaches the unit and reports its
// failures through the exit code (vmsim's tests cover the unit itself).
func TestSystemctl(t *testing.T) {
	dir, err := os.MkdirTemp("", "unit-") // short: a unix socket path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "sidecar.sock")
	u, err := vmsim.StartUnit(sock, func() error { return nil }, func() error {
		newDemoTB(t.Context(), io.Discard, dir).Fatalf("fatal in a helper")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	for _, tt := range []struct {
		name     string
		args     []string
		wantCode int
	}{
		{name: "restart", args: []string{"--socket", sock, "restart"}, wantCode: 0},
		{name: "stop failing fatally", args: []string{"--socket", sock, "stop"}, wantCode: 1},
		{name: "no socket", args: []string{"restart"}, wantCode: 2},
		{name: "no unit", args: []string{"--socket", filepath.Join(dir, "none.sock"), "restart"}, wantCode: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if code := systemctl(tt.args); code != tt.wantCode {
				t.Errorf("exit %d, want %d", code, tt.wantCode)
			}
		})
	}
}
