// Package cli is the command line Embark's binaries share: their exit codes,
// their usage text, and the rule that help, --version and a command line
// they do not accept are answered before anything starts.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Exit codes of Embark's binaries. docs/onboarding-agent.md and
// docs/onboarding-endpoint.md list them with what systemd or Kubernetes does
// on each; the agent's unit lists ExitUsage and ExitConfig in
// RestartPreventExitStatus.
const (
	// ExitOK: the command finished, or help or the version was printed.
	ExitOK = 0
	// ExitFailure: the command failed at run time; restarting may help.
	ExitFailure = 1
	// ExitUsage: the command line was not accepted (unknown command or
	// flag, bad flag value, extra argument); nothing was started.
	ExitUsage = 2
	// ExitConfig (sysexits' EX_CONFIG): a configuration file is missing or
	// invalid; restarting cannot help until it is fixed.
	ExitConfig = 78
)

// configError marks an error that exits ExitConfig.
type configError struct{ error }

func (e configError) Unwrap() error { return e.error }

// ConfigError marks err as a configuration error: Main exits ExitConfig.
func ConfigError(err error) error { return configError{err} }

// usageError is a command line Main does not accept.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// Command is one command of a binary.
type Command struct {
	// Name is the first argument that selects the command; "" for the
	// command that runs when the first argument is a flag or absent.
	Name string
	// Summary says in one line what the command does.
	Summary string
	// Flags are the command's flags, each with a description. Main sets
	// their output and, on the default command, adds --version.
	Flags *flag.FlagSet
	// Run starts the command once its flags parsed and no argument is
	// left; an error marked by ConfigError exits ExitConfig, any other
	// ExitFailure.
	Run func() error
}

// ExitCode is one exit code of a binary, for its usage text.
type ExitCode struct {
	Code    int
	Meaning string
}

// Program is a binary's command line.
type Program struct {
	// Name is the binary's name, as users type it.
	Name string
	// Summary says in one sentence what the binary is.
	Summary string
	// Version is the line --version prints.
	Version string
	// Commands are the binary's commands, the default one ("" Name) first.
	Commands []Command
	// ExitCodes are the codes the binary exits with, for the usage text.
	ExitCodes []ExitCode
}

// Main runs the command args select and returns the process's exit code.
// help, -h and --help print the usage to stdout; --version prints the
// version to stdout; an unknown command or flag, a bad flag value or an
// extra argument prints one line and a hint to stderr and exits ExitUsage.
// None of these runs a command. Main adds --version to the default
// command's flags: call it once per Program.
func (p Program) Main(args []string, stdout, stderr io.Writer) int {
	showVersion := p.Commands[0].Flags.Bool("version", false, "print the version and exit")
	for _, c := range p.Commands {
		c.Flags.SetOutput(io.Discard)
		c.Flags.Usage = func() {}
	}
	cmd, err := p.parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		p.usage(stdout)
		return ExitOK
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v\nrun '%s --help' for usage\n", p.Name, err, p.Name)
		return ExitUsage
	case *showVersion:
		fmt.Fprintln(stdout, p.Version)
		return ExitOK
	}
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", p.Name, err)
		if errors.As(err, new(configError)) {
			return ExitConfig
		}
		return ExitFailure
	}
	return ExitOK
}

// parse selects the command and parses its flags; it returns flag.ErrHelp
// for help, -h and --help, and a usageError for a command line it does not
// accept.
func (p Program) parse(args []string) (Command, error) {
	cmd := p.Commands[0]
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name := args[0]
		if name == "help" {
			if len(args) > 1 {
				return cmd, usageError{fmt.Sprintf("help takes no arguments, got %q", args[1])}
			}
			return cmd, flag.ErrHelp
		}
		found := false
		for _, c := range p.Commands[1:] {
			if c.Name == name {
				cmd, found = c, true
			}
		}
		if !found {
			return cmd, usageError{fmt.Sprintf("unknown command %q", name)}
		}
		args = args[1:]
	}
	if err := cmd.Flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cmd, err
		}
		return cmd, usageError{err.Error()}
	}
	if cmd.Flags.NArg() > 0 {
		return cmd, usageError{fmt.Sprintf("unexpected argument %q", cmd.Flags.Arg(0))}
	}
	return cmd, nil
}

// usage writes the usage text: the commands with their summaries, each
// command's flags with description and default, and the exit codes.
func (p Program) usage(w io.Writer) {
	fmt.Fprintf(w, "%s\n\nUsage:\n", p.Summary)
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	for _, c := range p.Commands {
		fmt.Fprintf(tw, "  %s\t%s\n", strings.Join(strings.Fields(p.Name+" "+c.Name+" [flags]"), " "), c.Summary)
	}
	fmt.Fprintf(tw, "  %s help\tprint this help (also -h, --help)\n", p.Name)
	fmt.Fprintf(tw, "  %s --version\tprint the version\n", p.Name)
	tw.Flush()
	for _, c := range p.Commands {
		if c.Name == "" {
			fmt.Fprintf(w, "\nFlags:\n")
		} else {
			fmt.Fprintf(w, "\nFlags of %s:\n", c.Name)
		}
		c.Flags.VisitAll(func(f *flag.Flag) { writeFlag(w, f) })
	}
	if len(p.ExitCodes) > 0 {
		fmt.Fprintf(w, "\nExit codes:\n")
		tw = tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
		for _, e := range p.ExitCodes {
			fmt.Fprintf(tw, "  %d\t%s\n", e.Code, e.Meaning)
		}
		tw.Flush()
	}
}

// writeFlag writes one flag as `--name value` (`-n value` for a one-letter
// name), then its description and
// its default when it has one.
func writeFlag(w io.Writer, f *flag.Flag) {
	value, description := flag.UnquoteUsage(f)
	line := "  --" + f.Name
	if len(f.Name) == 1 {
		line = "  -" + f.Name
	}
	if value != "" {
		line += " " + value
	}
	if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
		description += fmt.Sprintf(" (default %s)", f.DefValue)
	}
	fmt.Fprintf(w, "%s\n        %s\n", line, description)
}
