package vm

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/embark-mesh/embark/test/demo/step"
	"github.com/embark-mesh/embark/test/vmsim"
)

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
		step.NewTB(t.Context(), io.Discard, dir).Fatalf("fatal in a helper")
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
			if code := Systemctl(tt.args); code != tt.wantCode {
				t.Errorf("exit %d, want %d", code, tt.wantCode)
			}
		})
	}
}
