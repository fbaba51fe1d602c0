package vm

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/embark-mesh/embark/onboarding/agent"
	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/agent/platform"
	"github.com/embark-mesh/embark/test/vmsim"
)

// The demo binary's two modes for the simulated VMs: the first argument
// that runs it as a VM's onboarding agent (RunAgent), and as its systemctl
// (Systemctl).
const (
	AgentArg     = "onboarding-agent"
	SystemctlArg = "systemctl"
)

// The apiVersion and kinds of the agent's configuration files.
const (
	agentAPIVersion = config.APIVersion
	agentKind       = config.AgentKind
	onboardingKind  = config.OnboardingKind
)

// RunAgent is the demo binary run as `demo onboarding-agent --agent-config
// A --onboarding-config O`: the onboarding agent library (package
// onboarding/agent) wired as cmd/onboarding-agent wires it, in a process of
// its own so that a VM can be powered off (killed) without unregistering.
// It returns the exit code.
func RunAgent(args []string) int {
	fs := flag.NewFlagSet(AgentArg, flag.ContinueOnError)
	agentFile := fs.String("agent-config", "", "agent configuration file")
	onboardingFile := fs.String("onboarding-config", "", "onboarding configuration file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := runAgent(ctx, *agentFile, *onboardingFile, log, InProcess{Version: "v0.1.0-demo", MinBackoff: 500 * time.Millisecond, MaxBackoff: 5 * time.Second})
	if err != nil {
		fmt.Fprintf(os.Stderr, "onboarding-agent: %v\n", err)
		return 1
	}
	return 0
}

// Systemctl is the demo binary run as `demo systemctl --socket S VERB`: it
// asks the VM's sidecar unit to run VERB and returns non-zero when it
// failed.
func Systemctl(args []string) int {
	if len(args) != 3 || args[0] != "--socket" {
		fmt.Fprintln(os.Stderr, "usage: demo systemctl --socket SOCKET restart|stop")
		return 2
	}
	if err := vmsim.Systemctl(args[1], args[2]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// runAgent runs the onboarding agent library with the configuration files
// agentFile and onboardingFile until ctx ends.
func runAgent(ctx context.Context, agentFile, onboardingFile string, log *slog.Logger, o InProcess) error {
	agentCfg, err := config.LoadAgent(agentFile)
	if err != nil {
		return err
	}
	onbCfg, err := config.LoadOnboarding(onboardingFile)
	if err != nil {
		return err
	}
	plat, err := platform.Detect(ctx, agentCfg.Host, onbCfg.Audience(), log)
	if err != nil {
		return err
	}
	a, err := agent.New(agent.Options{Agent: agentCfg, Onboarding: onbCfg, Platform: plat, Version: o.Version, Logger: log,
		MinBackoff: o.MinBackoff, MaxBackoff: o.MaxBackoff})
	if err != nil {
		return err
	}
	return a.Run(ctx)
}
