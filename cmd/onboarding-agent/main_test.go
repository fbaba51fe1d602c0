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
	"github.com/embark-mesh/embark/version"
)

const hint = "run 'onboarding-agent --help' for usage\n"

func TestMain(m *testing.M) { clitest.Main(m, main) }

// TestBinaryStartsNothing runs the real main in a child process, as users
// run the binary: help, -h, --help and --version print to stdout and exit
// 0; an unknown flag or command exits 2 with the hint on stderr. The
// configuration flag names a file that does not exist, so a start would
// show: the last case, the same flag alone, starts and stops at that file
// with exit 78 (ExitConfig).
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
		{name: "-h", args: []string{"--agent-config", missing, "-h"}, wantStdout: "Usage:"},
		{name: "--help", args: []string{"--agent-config", missing, "--help"}, wantStdout: "Usage:"},
		{name: "--version", args: []string{"--agent-config", missing, "--version"}, wantStdout: version.Line("onboarding-agent") + "\n"},
		{name: "unknown flag", args: []string{"--agent-config", missing, "--no-such-flag"}, wantCode: cli.ExitUsage, wantStderr: "flag provided but not defined: -no-such-flag\n" + hint},
		{name: "unknown command", args: []string{"frobnicate", "--agent-config", missing}, wantCode: cli.ExitUsage, wantStderr: "unknown command \"frobnicate\"\n" + hint},
		{name: "starts", args: []string{"--agent-config", missing}, wantCode: cli.ExitConfig, wantStderr: missing},
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

// TestCommandLine runs the agent's real command line (program(...).Main)
// with starters that record what they were asked to start: help, -h, --help
// and --version print to stdout and exit 0; an unknown command or flag, a
// bad flag value and an extra argument print one line and a hint to stderr
// and exit 2; none of these starts the agent or apply-sidecar. An accepted
// command line starts the command it names, and its error decides the exit
// code.
func TestCommandLine(t *testing.T) {
	tests := []struct {
		name        string
		args        []string
		runErr      error
		wantCode    int
		wantUsage   bool   // stdout is the usage text
		wantStdout  string // stdout exactly, unless wantUsage
		wantStderr  string // stderr exactly
		wantStarted string // "agent", "apply-sidecar" or "" for nothing
	}{
		{name: "help", args: []string{"help"}, wantUsage: true},
		{name: "-h", args: []string{"-h"}, wantUsage: true},
		{name: "--help", args: []string{"--help"}, wantUsage: true},
		{name: "--help after a flag", args: []string{"--agent-config", "/a.yaml", "--help"}, wantUsage: true},
		{name: "apply-sidecar --help", args: []string{"apply-sidecar", "--help"}, wantUsage: true},
		{name: "--version", args: []string{"--version"}, wantStdout: version.Line("onboarding-agent") + "\n"},
		{name: "unknown command", args: []string{"start"}, wantCode: cli.ExitUsage,
			wantStderr: "onboarding-agent: unknown command \"start\"\n" + hint},
		{name: "unknown flag", args: []string{"--agent-confg", "/a.yaml"}, wantCode: cli.ExitUsage,
			wantStderr: "onboarding-agent: flag provided but not defined: -agent-confg\n" + hint},
		{name: "unknown flag of apply-sidecar", args: []string{"apply-sidecar", "--token", "/t"}, wantCode: cli.ExitUsage,
			wantStderr: "onboarding-agent: flag provided but not defined: -token\n" + hint},
		{name: "bad flag value", args: []string{"-v=maybe"}, wantCode: cli.ExitUsage,
			wantStderr: "onboarding-agent: invalid boolean value \"maybe\" for -v: parse error\n" + hint},
		{name: "extra argument", args: []string{"--agent-config", "/a.yaml", "extra"}, wantCode: cli.ExitUsage,
			wantStderr: "onboarding-agent: unexpected argument \"extra\"\n" + hint},
		{name: "extra argument of apply-sidecar", args: []string{"apply-sidecar", "now"}, wantCode: cli.ExitUsage,
			wantStderr: "onboarding-agent: unexpected argument \"now\"\n" + hint},
		{name: "help with an argument", args: []string{"help", "apply-sidecar"}, wantCode: cli.ExitUsage,
			wantStderr: "onboarding-agent: help takes no arguments, got \"apply-sidecar\"\n" + hint},
		{name: "agent", args: []string{"--agent-config", "/a.yaml", "-v"}, wantStarted: "agent"},
		{name: "agent configuration error", args: []string{"--agent-config", "/a.yaml", "-v"}, runErr: cli.ConfigError(errors.New("agent configuration /a.yaml: host.platform: Unsupported value")),
			wantCode: cli.ExitConfig, wantStderr: "onboarding-agent: agent configuration /a.yaml: host.platform: Unsupported value\n", wantStarted: "agent"},
		{name: "agent failure", args: []string{"--agent-config", "/a.yaml", "-v"}, runErr: errors.New("cannot stop the sidecar"),
			wantCode: cli.ExitFailure, wantStderr: "onboarding-agent: cannot stop the sidecar\n", wantStarted: "agent"},
		{name: "apply-sidecar", args: []string{"apply-sidecar", "--agent-config", "/a.yaml"}, wantStarted: "apply-sidecar"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var started string
			p := program(starters{
				agent: func(f agentFlags) error {
					started = "agent"
					if f.agentFile != "/a.yaml" || !f.verbose {
						t.Errorf("agent started with %+v, want --agent-config /a.yaml -v", f)
					}
					return tt.runErr
				},
				applySidecar: func(agentFile string) error {
					started = "apply-sidecar"
					if agentFile != "/a.yaml" {
						t.Errorf("apply-sidecar started with --agent-config %q, want /a.yaml", agentFile)
					}
					return tt.runErr
				},
			})
			var stdout, stderr bytes.Buffer
			if code := p.Main(tt.args, &stdout, &stderr); code != tt.wantCode {
				t.Errorf("exit code %d, want %d", code, tt.wantCode)
			}
			if started != tt.wantStarted {
				t.Errorf("started %q, want %q", started, tt.wantStarted)
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

// checkUsage fails unless text names every command with its summary, every
// flag with a description, and the exit codes.
func checkUsage(t *testing.T, p cli.Program, text string) {
	t.Helper()
	for _, want := range []string{"onboarding-agent [flags]", "onboarding-agent apply-sidecar [flags]", "onboarding-agent help", "onboarding-agent --version", "Exit codes:", "  78   "} {
		if !strings.Contains(text, want) {
			t.Errorf("usage lacks %q:\n%s", want, text)
		}
	}
	flags := 0
	for _, c := range p.Commands {
		if !strings.Contains(text, c.Summary) {
			t.Errorf("usage lacks the summary of %q:\n%s", c.Name, text)
		}
		c.Flags.VisitAll(func(f *flag.Flag) {
			flags++
			name := "--" + f.Name
			if len(f.Name) == 1 {
				name = "-" + f.Name
			}
			_, description := flag.UnquoteUsage(f)
			if len(description) < 10 || !strings.Contains(text, "\n  "+name) || !strings.Contains(text, description) {
				t.Errorf("usage does not name %s with its description %q:\n%s", name, description, text)
			}
		})
	}
	// The agent's eight flags, --version and apply-sidecar's one.
	if flags != 10 {
		t.Errorf("%d flags, want 10", flags)
	}
}
