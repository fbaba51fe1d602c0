// Command demo runs Embark locally, as `make demo` does: a real
// kube-apiserver + etcd with Embark's and Istio's CRDs, the onboarding
// endpoint serving over TLS, the seed 004 bookinfo WorkloadGroup,
// OnboardingPolicy and Sidecar, and simulated EC2 instances (loopback IMDS
// and STS with a demo AWS certificate) that onboard through the endpoint's
// API and run Istio's real pilot-agent (without Envoy) as their sidecar,
// connected to Embark's xDS server with the token registration returned.
//
// It runs numbered steps, each printing what a user would see (kubectl,
// istioctl) and checking it; a failed step is named with the reason and the
// exit code is non-zero. Then it keeps everything running until Ctrl-C, or
// exits at once when CI=true or standard input is not a terminal. Every
// child process and temporary file is gone when it exits.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

func main() {
	// The simulated VMs' onboarding agents run the demo binary as their
	// systemctl to restart and stop the sidecar (see sidecarUnit).
	if len(os.Args) > 1 && os.Args[1] == systemctlArg {
		os.Exit(systemctl(os.Args[2:]))
	}
	// Libraries that log through controller-runtime's logger or klog: keep
	// them quiet (the endpoint logs to a file in the demo's directory).
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	interactive := os.Getenv("CI") != "true" && isTerminal(os.Stdin)
	if err := run(ctx, os.Stdout, interactive); err != nil {
		var se *stepError
		if errors.As(err, &se) {
			fmt.Fprintf(os.Stderr, "\ndemo FAILED at %v\n", err)
		} else {
			fmt.Fprintf(os.Stderr, "\ndemo FAILED: %v\n", err)
		}
		stop()
		os.Exit(1)
	}
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
