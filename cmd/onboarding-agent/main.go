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
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/embark-mesh/embark/cmd/internal/cli"
	"github.com/embark-mesh/embark/onboarding/agent"
	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/agent/hostdns"
	"github.com/embark-mesh/embark/onboarding/agent/platform"
	"github.com/embark-mesh/embark/onboarding/agent/sidecar"
	"github.com/embark-mesh/embark/version"
)

func main() {
	os.Exit(program(starters{agent: runAgent, applySidecar: runApplySidecar}).Main(os.Args[1:], os.Stdout, os.Stderr))
}

// agentFlags are the agent's command-line flags.
type agentFlags struct {
	agentFile, onboardingFile                   string
	clusterEnv, meshConfig, rootCert, tokenFile string
	jwtFile                                     string
	verbose                                     bool
}

// starters start what a command line selects; tests replace them to see
// that help, --version and command lines that are not accepted start
// nothing.
type starters struct {
	agent        func(agentFlags) error
	applySidecar func(agentFile string) error
}

// program is the agent's command line: the agent itself and apply-sidecar.
func program(s starters) cli.Program {
	var af agentFlags
	agentFS := flag.NewFlagSet("onboarding-agent", flag.ContinueOnError)
	agentFS.StringVar(&af.agentFile, "agent-config", config.DefaultAgentConfigFile, "agent configuration `file`")
	agentFS.StringVar(&af.onboardingFile, "onboarding-config", config.DefaultOnboardingFile, "onboarding configuration `file`: the endpoint, the WorkloadGroup, the workload")
	agentFS.StringVar(&af.clusterEnv, "cluster-env", "", "`path` of the sidecar's cluster.env to write (overrides sidecar.bootstrap.clusterEnv)")
	agentFS.StringVar(&af.meshConfig, "mesh-config", "", "`path` of the sidecar's mesh configuration to write (overrides sidecar.bootstrap.meshConfig)")
	agentFS.StringVar(&af.rootCert, "root-cert", "", "`path` of the sidecar's root certificate to write (overrides sidecar.bootstrap.rootCert)")
	agentFS.StringVar(&af.tokenFile, "token", "", "`path` of the sidecar's token to write (overrides sidecar.bootstrap.token)")
	agentFS.StringVar(&af.jwtFile, "jwt-token-file", "", "`file` holding the host's JWT (overrides host.jwt.tokenFile)")
	agentFS.BoolVar(&af.verbose, "v", false, "debug logging")

	var sidecarAgentFile string
	sidecarFS := flag.NewFlagSet("onboarding-agent apply-sidecar", flag.ContinueOnError)
	sidecarFS.StringVar(&sidecarAgentFile, "agent-config", config.DefaultAgentConfigFile, "agent configuration `file`: its sidecar section says where the staged files are installed")

	return cli.Program{
		Name:    "onboarding-agent",
		Summary: "onboarding-agent joins this host to the Istio mesh through Embark's onboarding endpoint and keeps the Istio sidecar's bootstrap and tokens current.",
		Version: version.Line("onboarding-agent"),
		Commands: []cli.Command{
			{
				Summary: "run the agent (onboarding-agent.service): onboard, write the sidecar's bootstrap, renew its tokens; SIGTERM unregisters",
				Flags:   agentFS, Run: func() error { return s.agent(af) },
			},
			{
				Name: "apply-sidecar", Summary: "as root (onboarding-agent-sidecar.service): install the bootstrap the agent staged, restart or stop the sidecar",
				Flags: sidecarFS, Run: func() error { return s.applySidecar(sidecarAgentFile) },
			},
		},
		ExitCodes: []cli.ExitCode{
			{Code: cli.ExitOK, Meaning: "done; or help or the version printed"},
			{Code: cli.ExitFailure, Meaning: "failed at run time; onboarding-agent.service restarts it after 10 s"},
			{Code: cli.ExitUsage, Meaning: "command line not accepted; nothing started, systemd does not restart"},
			{Code: cli.ExitConfig, Meaning: "configuration file missing or invalid; systemd does not restart"},
		},
	}
}

// runApplySidecar is `onboarding-agent apply-sidecar`, run as root by
// onboarding-agent-sidecar.service when the agent writes a request: it
// installs the staged bootstrap and restarts, or stops, the sidecar's unit.
func runApplySidecar(agentFile string) error {
	cfg, err := config.LoadAgent(agentFile)
	if err != nil {
		return cli.ConfigError(err)
	}
	if cfg.Sidecar.Direct() {
		return cli.ConfigError(errors.New("sidecar.restartCommand is set: the agent runs the sidecar's commands itself; apply-sidecar is not used"))
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	opts := sidecar.ApplyOptions{
		StagingDir: cfg.Sidecar.StagingDir, Paths: cfg.Sidecar.Bootstrap, Unit: cfg.Sidecar.Unit,
		Systemctl: sidecar.SystemctlCommand, Logger: log,
	}
	if cfg.Sidecar.DNS.On() {
		dns := cfg.Sidecar.DNS
		link, err := hostdns.NewLink(dns.Link.Name, dns.Link.Address, dns.Address, dns.Domains)
		if err != nil {
			return cli.ConfigError(err)
		}
		opts.HostDNS = &sidecar.HostDNS{Link: link, Options: hostdns.Options{Run: runCombined}}
	}
	_, err = sidecar.Apply(context.Background(), opts)
	return err
}

// runCombined runs argv and returns its combined output.
func runCombined(ctx context.Context, argv ...string) ([]byte, error) {
	return exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
}

// runAgent is the agent itself, onboarding-agent.service: it runs until
// SIGTERM or a failure it cannot retry.
func runAgent(f agentFlags) error {
	level := slog.LevelInfo
	if f.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	agentCfg, err := config.LoadAgent(f.agentFile)
	if err != nil {
		return cli.ConfigError(err)
	}
	for _, o := range []struct {
		flag string
		into *string
	}{{f.clusterEnv, &agentCfg.Sidecar.Bootstrap.ClusterEnv}, {f.meshConfig, &agentCfg.Sidecar.Bootstrap.MeshConfig},
		{f.rootCert, &agentCfg.Sidecar.Bootstrap.RootCert}, {f.tokenFile, &agentCfg.Sidecar.Bootstrap.Token}, {f.jwtFile, &agentCfg.Host.JWT.TokenFile}} {
		if o.flag != "" {
			*o.into = o.flag
		}
	}
	if agentCfg.StateDirectory == "" {
		// systemd's StateDirectory= (a colon-separated list when the unit
		// names several).
		agentCfg.StateDirectory, _, _ = strings.Cut(os.Getenv("STATE_DIRECTORY"), ":")
	}
	if errs := agentCfg.Validate(); len(errs) > 0 {
		return cli.ConfigError(fmt.Errorf("agent configuration with flags: %w", errs.ToAggregate()))
	}
	onbCfg, err := config.LoadOnboarding(f.onboardingFile)
	if err != nil {
		return cli.ConfigError(err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	plat, err := platform.Detect(ctx, agentCfg.Host, onbCfg.Audience(), log)
	if err != nil {
		return err
	}
	a, err := agent.New(agent.Options{Agent: agentCfg, Onboarding: onbCfg, Platform: plat, Version: version.Get().Version, Logger: log})
	if err != nil {
		return cli.ConfigError(err)
	}
	if addr := agentCfg.Metrics.Address; addr != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(a.Collector(agentCfg.Metrics.SidecarReadyURL))
		if err := agent.ServeMetrics(ctx, addr, reg, log); err != nil {
			return err
		}
	}
	return a.Run(ctx)
}
