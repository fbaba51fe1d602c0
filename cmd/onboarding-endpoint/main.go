// Command onboarding-endpoint runs Embark's onboarding endpoint beside istiod.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/embark-mesh/embark/cmd/onboarding-endpoint/app"
	"github.com/embark-mesh/embark/version"
)

func main() {
	var opts app.Options
	flag.StringVar(&opts.ConfigFile, "config", "/etc/onboarding-endpoint/config.yaml", "OnboardingEndpointConfiguration file")
	flag.StringVar(&opts.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster or $KUBECONFIG)")
	flag.StringVar(&opts.Replica, "replica", os.Getenv("POD_NAME"), "name of this replica (default: $POD_NAME, else the host name)")
	flag.StringVar(&opts.DebugXDS, "debug-xds", app.DefaultDebugXDS, `loopback address of the unauthenticated xDS debug listener (for istioctl proxy-status), or "off"`)
	flag.IntVar(&opts.EventCacheSize, "event-cache-size", 0, "entries of each LRU cache of the event correlator (0: client-go's 4096)")
	flag.StringVar(&opts.Pprof, "pprof", "", "loopback address serving Go runtime profiles (/debug/pprof/), e.g. 127.0.0.1:6060; default off")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Line("onboarding-endpoint"))
		return
	}
	handler := slog.NewJSONHandler(os.Stderr, nil)
	opts.Logger = slog.New(handler)
	ctrllog.SetLogger(logr.FromSlogHandler(handler))
	klog.SetSlogLogger(opts.Logger)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.Run(ctx, opts); err != nil {
		fmt.Fprintf(os.Stderr, "onboarding-endpoint: %v\n", err)
		os.Exit(1)
	}
}
