// Package clitest runs a binary's real main function in a child process
// from its package's tests: the test binary re-executes itself with the
// arguments, and Main runs main instead of the tests. The tests then see
// what users see (exit code, stdout, stderr) without building the binary.
package clitest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"testing"
)

// runMainEnv tells a re-executed test binary to run main.
const runMainEnv = "EMBARK_CLITEST_RUN_MAIN"

// Main is the package's TestMain: it runs main when the test binary was
// re-executed by Run, the tests otherwise.
func Main(m *testing.M, main func()) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Result is what a run of main left.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// Run runs the package's main with args in a child process (the test
// binary, re-executed) and returns its exit code and output.
func Run(t *testing.T, args ...string) Result {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), exe, args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run main %v: %v", args, err)
	}
	return Result{Code: cmd.ProcessState.ExitCode(), Stdout: stdout.String(), Stderr: stderr.String()}
}
