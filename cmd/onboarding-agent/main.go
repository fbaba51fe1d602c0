// Command onboarding-agent runs on a VM next to the Istio sidecar and joins
// the workload to the mesh through Embark's onboarding endpoint. The flow
// lives in package onboarding/agent; see docs/onboarding-agent.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/embark-mesh/embark/onboarding/agent"
	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/agent/platform"
	"github.com/embark-mesh/embark/onboarding/agent/sidecar"
	"github.com/embark-mesh/embark/version"
)

// exitConfig (sysexits' EX_CONFIG) means a configuration error: the units
// list it in RestartPreventExitStatus, so systemd does not restart-loop an
// agent that cannot start until an operator fixes a file.
const exitConfig = 78

// configError marks errors that exit with exitConfig.
type configError struct{ error }

func (e configError) Unwrap() error { return e.error }

func main() {
	run := runAgent
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "apply-sidecar" {
		run, args = runApplySidecar, args[1:]
	}
	if err := run(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // -h/--help printed the usage: not a failure
		}
		fmt.Fprintf(os.Stderr, "onboarding-agent: %v\n", err)
		var ce configError
		if errors.As(err, &ce) {
			os.Exit(exitConfig)
		}
		os.Exit(1)
	}
}

// runApplySidecar is `onboarding-agent apply-sidecar`, run as root by
// onboarding-agent-sidecar.service when the agent writes a request: it
// installs the staged bootstrap and restarts, or stops, the sidecar's unit.
func runApplySidecar(args []string) error {
	fs := flag.NewFlagSet("onboarding-agent apply-sidecar", flag.ContinueOnError)
	agentFile := fs.String("agent-config", config.DefaultAgentConfigFile, "agent configuration file")
	if err := fs.Parse(args); err != nil {
		return configError{err}
	}
	cfg, err := config.LoadAgent(*agentFile)
	if err != nil {
		return configError{err}
	}
	if cfg.Sidecar.Direct() {
		return configError{errors.New("sidecar.restartCommand is set: the agent runs the sidecar's commands itself; apply-sidecar is not used")}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	_, err = sidecar.Apply(context.Background(), sidecar.ApplyOptions{
		StagingDir: cfg.Sidecar.StagingDir, Paths: cfg.Sidecar.Bootstrap, Unit: cfg.Sidecar.Unit,
		Systemctl: sidecar.SystemctlCommand, Logger: log,
	})
	return err
}

func runAgent(args []string) error {
	fs := flag.NewFlagSet("onboarding-agent", flag.ContinueOnError)
	agentFile := fs.String("agent-config", config.DefaultAgentConfigFile, "agent configuration file")
	onboardingFile := fs.String("onboarding-config", config.DefaultOnboardingFile, "onboarding configuration file")
	clusterEnv := fs.String("cluster-env", "", "override sidecar.bootstrap.clusterEnv")
	meshConfig := fs.String("mesh-config", "", "override sidecar.bootstrap.meshConfig")
	rootCert := fs.String("root-cert", "", "override sidecar.bootstrap.rootCert")
	tokenFile := fs.String("token", "", "override sidecar.bootstrap.token")
	jwtFile := fs.String("jwt-token-file", "", "override host.jwt.tokenFile")
	verbose := fs.Bool("v", false, "debug logging")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return configError{err}
	}
	if *showVersion {
		fmt.Println(version.Line("onboarding-agent"))
		return nil
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	agentCfg, err := config.LoadAgent(*agentFile)
	if err != nil {
		return configError{err}
	}
	for _, o := range []struct {
		flag string
		into *string
	}{{*clusterEnv, &agentCfg.Sidecar.Bootstrap.ClusterEnv}, {*meshConfig, &agentCfg.Sidecar.Bootstrap.MeshConfig},
		{*rootCert, &agentCfg.Sidecar.Bootstrap.RootCert}, {*tokenFile, &agentCfg.Sidecar.Bootstrap.Token}, {*jwtFile, &agentCfg.Host.JWT.TokenFile}} {
		if o.flag != "" {
			*o.into = o.flag
		}
	}
	if errs := agentCfg.Validate(); len(errs) > 0 {
		return configError{fmt.Errorf("agent configuration with flags: %w", errs.ToAggregate())}
	}
	onbCfg, err := config.LoadOnboarding(*onboardingFile)
	if err != nil {
		return configError{err}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	plat, err := platform.Detect(ctx, agentCfg.Host, onbCfg.Audience(), log)
	if err != nil {
		return err
	}
	a, err := agent.New(agent.Options{Agent: agentCfg, Onboarding: onbCfg, Platform: plat, Version: version.Get().Version, Logger: log})
	if err != nil {
		return configError{err}
	}
	return a.Run(ctx)
}
