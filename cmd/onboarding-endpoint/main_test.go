package main

import (
	"bytes"
	"errors"
	"flag"
	"path/filepath"
	"strings"
	"testing"

	"github.com/embark-mesh/embark/cmd/internal/cli"
	"github.com/embark-mesh/embark/cmd/internal/cli/clitest"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/app"
	"github.com/embark-mesh/embark/version"
)

const hint = "run 'onboarding-endpoint --help' for usage\n"

func TestMain(m *testing.M) { clitest.Main(m, main) }

// TestBinaryStartsNothing runs the real main in a child process, as users
// run the binary: help, -h, --help and --version print to stdout and exit
// 0; an unknown flag or command exits 2 with the hint on stderr. The
// configuration flag names a file that does not exist, so a start would
// show: the last case, the same flag alone, starts and stops at that file
// with exit 1.
func TestBinaryStartsNothing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string // stdout contains it ("": stdout is empty)
		wantStderr string // stderr contains it ("": stderr is empty)
	}{
		{name: "help", args: []string{"help"}, wantStdout: "Usage:"},
		{name: "-h", args: []string{"--config", missing, "-h"}, wantStdout: "Usage:"},
		{name: "--help", args: []string{"--config", missing, "--help"}, wantStdout: "Usage:"},
		{name: "--version", args: []string{"--config", missing, "--version"}, wantStdout: version.Line("onboarding-endpoint") + "\n"},
		{name: "unknown flag", args: []string{"--config", missing, "--no-such-flag"}, wantCode: cli.ExitUsage, wantStderr: "flag provided but not defined: -no-such-flag\n" + hint},
		{name: "unknown command", args: []string{"frobnicate", "--config", missing}, wantCode: cli.ExitUsage, wantStderr: "unknown command \"frobnicate\"\n" + hint},
		{name: "starts", args: []string{"--config", missing}, wantCode: cli.ExitFailure, wantStderr: missing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := clitest.Run(t, tt.args...)
			if got.Code != tt.wantCode {
				t.Errorf("exit code %d, want %d; stderr:\n%s", got.Code, tt.wantCode, got.Stderr)
			}
			for _, out := range []struct{ name, got, want string }{{"stdout", got.Stdout, tt.wantStdout}, {"stderr", got.Stderr, tt.wantStderr}} {
				if (out.want == "" && out.got != "") || !strings.Contains(out.got, out.want) {
					t.Errorf("%s %q, want it to contain %q (empty: nothing)", out.name, out.got, out.want)
				}
			}
		})
	}
}

// TestCommandLine runs the endpoint's real command line (program(...).Main)
// with a start function that records whether it was called: help, -h,
// --help and --version (also after a flag) print to stdout and exit 0; an
// unknown command or flag, a bad flag value, help with an argument and an
// extra argument print one line and a hint to stderr and exit 2; none of
// these starts the endpoint. An accepted command line starts it with its
// flags, and its error exits 1.
func TestCommandLine(t *testing.T) {
	tests := []struct {
		name        string
		args        []string
		runErr      error
		wantCode    int
		wantUsage   bool   // stdout is the usage text
		wantStdout  string // stdout exactly, unless wantUsage
		wantStderr  string // stderr exactly
		wantStarted bool
	}{
		{name: "help", args: []string{"help"}, wantUsage: true},
		{name: "-h", args: []string{"-h"}, wantUsage: true},
		{name: "--help", args: []string{"--help"}, wantUsage: true},
		{name: "--help after a flag", args: []string{"--config", "/c.yaml", "--help"}, wantUsage: true},
		{name: "--version", args: []string{"--version"}, wantStdout: version.Line("onboarding-endpoint") + "\n"},
		{name: "--version after a flag", args: []string{"--config", "/c.yaml", "--version"}, wantStdout: version.Line("onboarding-endpoint") + "\n"},
		{name: "bad flag value", args: []string{"--event-cache-size=many"}, wantCode: cli.ExitUsage,
			wantStderr: "onboarding-endpoint: invalid value \"many\" for flag -event-cache-size: parse error\n" + hint},
		{name: "help with an argument", args: []string{"help", "config"}, wantCode: cli.ExitUsage,
			wantStderr: "onboarding-endpoint: help takes no arguments, got \"config\"\n" + hint},
		{name: "unknown command", args: []string{"serve"}, wantCode: cli.ExitUsage,
			wantStderr: "onboarding-endpoint: unknown command \"serve\"\n" + hint},
		{name: "unknown flag", args: []string{"--confg=/c.yaml"}, wantCode: cli.ExitUsage,
			wantStderr: "onboarding-endpoint: flag provided but not defined: -confg\n" + hint},
		{name: "extra argument", args: []string{"--config", "/c.yaml", "extra"}, wantCode: cli.ExitUsage,
			wantStderr: "onboarding-endpoint: unexpected argument \"extra\"\n" + hint},
		{name: "endpoint", args: []string{"--config", "/c.yaml"}, wantStarted: true},
		{name: "endpoint failure", args: []string{"--config", "/c.yaml"}, runErr: errors.New("load configuration /c.yaml: no such file"),
			wantCode: cli.ExitFailure, wantStderr: "onboarding-endpoint: load configuration /c.yaml: no such file\n", wantStarted: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			started := false
			p := program(func(opts app.Options) error {
				started = true
				if opts.ConfigFile != "/c.yaml" {
					t.Errorf("started with --config %q, want /c.yaml", opts.ConfigFile)
				}
				return tt.runErr
			})
			var stdout, stderr bytes.Buffer
			if code := p.Main(tt.args, &stdout, &stderr); code != tt.wantCode {
				t.Errorf("exit code %d, want %d", code, tt.wantCode)
			}
			if started != tt.wantStarted {
				t.Errorf("started %v, want %v", started, tt.wantStarted)
			}
			if tt.wantUsage {
				checkUsage(t, p, stdout.String())
			} else if stdout.String() != tt.wantStdout {
				t.Errorf("stdout %q, want %q", stdout.String(), tt.wantStdout)
			}
			if stderr.String() != tt.wantStderr {
				t.Errorf("stderr %q, want %q", stderr.String(), tt.wantStderr)
			}
		})
	}
}

// checkUsage fails unless text names the command, every flag with a
// description, and the exit codes.
func checkUsage(t *testing.T, p cli.Program, text string) {
	t.Helper()
	for _, want := range []string{"onboarding-endpoint [flags]", p.Commands[0].Summary, "onboarding-endpoint help", "Exit codes:", "  2   "} {
		if !strings.Contains(text, want) {
			t.Errorf("usage lacks %q:\n%s", want, text)
		}
	}
	flags := 0
	p.Commands[0].Flags.VisitAll(func(f *flag.Flag) {
		flags++
		_, description := flag.UnquoteUsage(f)
		if len(description) < 10 || !strings.Contains(text, "\n  --"+f.Name) || !strings.Contains(text, description) {
			t.Errorf("usage does not name --%s with its description %q:\n%s", f.Name, description, text)
		}
	})
	// Six flags and --version.
	if flags != 7 {
		t.Errorf("%d flags, want 7", flags)
	}
}
