// Command onboarding-endpoint runs Embark's onboarding endpoint beside istiod.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/embark-mesh/embark/cmd/internal/cli"
	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/app"
	"github.com/embark-mesh/embark/version"
)

func main() {
	os.Exit(program(runEndpoint).Main(os.Args[1:], os.Stdout, os.Stderr))
}

// program is the endpoint's command line; start runs the endpoint (tests
// replace it to see that help, --version and command lines that are not
// accepted start nothing).
func program(start func(app.Options) error) cli.Program {
	var opts app.Options
	fs := flag.NewFlagSet("onboarding-endpoint", flag.ContinueOnError)
	fs.StringVar(&opts.ConfigFile, "config", "/etc/onboarding-endpoint/config.yaml", "OnboardingEndpointConfiguration `file`")
	fs.StringVar(&opts.Kubeconfig, "kubeconfig", "", "kubeconfig `file` (default: in-cluster or $KUBECONFIG)")
	fs.StringVar(&opts.Replica, "replica", os.Getenv("POD_NAME"), "`name` of this replica (default: $POD_NAME, else the host name)")
	fs.StringVar(&opts.DebugXDS, "debug-xds", app.DefaultDebugXDS, "loopback `address` of the unauthenticated xDS debug listener (for istioctl proxy-status), or \"off\"")
	fs.IntVar(&opts.EventCacheSize, "event-cache-size", 0, "`entries` of each LRU cache of the event correlator (0: client-go's 4096)")
	fs.StringVar(&opts.Pprof, "pprof", "", "loopback `address` serving Go runtime profiles (/debug/pprof/), e.g. 127.0.0.1:6060; default off")
	return cli.Program{
		Name:    "onboarding-endpoint",
		Summary: "onboarding-endpoint runs Embark's onboarding endpoint and xDS server beside istiod.",
		Version: version.Line("onboarding-endpoint"),
		Commands: []cli.Command{{
			Summary: "run the endpoint until SIGTERM",
			Flags:   fs, Run: func() error { return start(opts) },
		}},
		ExitCodes: []cli.ExitCode{
			{Code: cli.ExitOK, Meaning: "stopped on SIGTERM; or help or the version printed"},
			{Code: cli.ExitFailure, Meaning: "failed (configuration included); Kubernetes restarts the container"},
			{Code: cli.ExitUsage, Meaning: "command line not accepted; nothing started"},
		},
	}
}

// runEndpoint runs the endpoint with JSON logs on stderr until SIGTERM.
func runEndpoint(opts app.Options) error {
	handler := slog.NewJSONHandler(os.Stderr, nil)
	opts.Logger = slog.New(handler)
	ctrllog.SetLogger(logr.FromSlogHandler(handler))
	klog.SetSlogLogger(opts.Logger)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return app.Run(ctx, opts)
}
