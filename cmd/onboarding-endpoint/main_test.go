package main

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/embark-mesh/embark/cmd/internal/cli"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/app"
	"github.com/embark-mesh/embark/version"
)

const hint = "run 'onboarding-endpoint --help' for usage\n"

// TestCommandLine runs the endpoint's real command line (program(...).Main)
// with a start function that records whether it was called: help, -h,
// --help and --version print to stdout and exit 0; an unknown command or
// flag and an extra argument print one line and a hint to stderr and exit
// 2; none of these starts the endpoint. An accepted command line starts it
// with its flags, and its error exits 1.
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
		{name: "--version", args: []string{"--version"}, wantStdout: version.Line("onboarding-endpoint") + "\n"},
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
