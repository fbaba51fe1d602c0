package version

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestRegisterBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := Register(reg); err != nil {
		t.Fatal(err)
	}
	i := Get()
	want := `# HELP embark_build_info Always 1; the labels say which build of Embark is running.
# TYPE embark_build_info gauge
embark_build_info{goversion="` + runtime.Version() + `",revision="` + i.Revision + `",version="` + i.Version + `"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "embark_build_info"); err != nil {
		t.Error(err)
	}
	if err := Register(reg); err == nil {
		t.Error("second Register: want an already-registered error")
	}
}

// TestBinariesPrintVersion builds both binaries with the Makefile's
// stamping flags and runs them: --version prints the stamped version and
// revision and exits 0; help and --help print the usage and exit 0.
func TestBinariesPrintVersion(t *testing.T) {
	dir := t.TempDir()
	ldflags := "-X github.com/embark-mesh/embark/version.version=v9.8.7-test -X github.com/embark-mesh/embark/version.revision=abc123"
	// One build of both: they share most packages.
	build := exec.CommandContext(t.Context(), "go", "build", "-ldflags", ldflags, "-o", dir+"/", "../cmd/onboarding-endpoint", "../cmd/onboarding-agent")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, b)
	}
	// A flag each binary's usage names.
	flags := map[string]string{"onboarding-endpoint": "--config", "onboarding-agent": "--agent-config"}
	for name, flag := range flags {
		out := filepath.Join(dir, name)
		tests := []struct {
			name      string
			args      []string
			wantOut   string
			wantUsage bool
		}{
			{name: "version", args: []string{"--version"}, wantOut: name + " v9.8.7-test (revision abc123, " + runtime.Version() + ")\n"},
			{name: "help", args: []string{"help"}, wantUsage: true},
			{name: "--help", args: []string{"--help"}, wantUsage: true},
		}
		for _, tc := range tests {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				cmd := exec.CommandContext(t.Context(), out, tc.args...)
				b, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("%s %v: %v (want exit 0)\n%s", name, tc.args, err, b)
				}
				if tc.wantUsage {
					if !strings.Contains(string(b), "\n  "+name+" [flags]") || !strings.Contains(string(b), "\n  "+flag+" file") {
						t.Errorf("%s %v printed no usage:\n%s", name, tc.args, b)
					}
					return
				}
				if string(b) != tc.wantOut {
					t.Errorf("%s %v printed %q, want %q", name, tc.args, b, tc.wantOut)
				}
			})
		}
	}
}
