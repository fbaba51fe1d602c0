// Command demo runs Embark locally, as `make demo` does: a real
// kube-apiserver + etcd with Embark's and Istio's CRDs, the onboarding
// endpoint serving over TLS, the example bookinfo WorkloadGroup,
// OnboardingPolicy and Sidecar, and simulated EC2 instances (loopback IMDS
// and STS with a demo AWS certificate), each running the real onboarding
// agent, which onboards, writes the sidecar's bootstrap and starts Istio's
// real pilot-agent (without Envoy) as the sidecar through the VM's
// simulated systemd unit. An on-prem host (an OIDC JWT), an ECS task, a
// Compute Engine instance and an Azure VM (their metadata servers and key
// endpoints on loopback) onboard the same way through their own agents, and
// each of the last three platforms refuses a workload by its policy rule.
// The mesh has two networks, declared as
// docs/multi-network.md says (test/meshnet): the pods on kube-network behind
// vmgateway, the seed group's VMs on virtual-machines; the last steps show
// what istiod sends each side of the other.
//
// It runs numbered steps, each printing what a user would see (kubectl,
// istioctl) and checking it; a failed step is named with the reason and the
// exit code is non-zero. Then it keeps everything running until Ctrl-C, or
// exits at once when CI=true or standard input is not a terminal. Every
// child process and temporary file is gone when it exits. See docs/demo.md.
//
// The binary has two more modes, used by the simulated VMs: `demo
// onboarding-agent` (the VM's agent) and `demo systemctl` (its restart and
// stop commands).
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

	"github.com/embark-mesh/embark/test/demo/step"
	"github.com/embark-mesh/embark/test/demo/vm"
)

func main() {
	// The simulated VMs' onboarding agents run the demo binary as their
	// systemctl to restart and stop the sidecar (see package vm),
	if len(os.Args) > 1 && os.Args[1] == vm.SystemctlArg {
		os.Exit(vm.Systemctl(os.Args[2:]))
	}
	// and run the demo binary as their onboarding agent.
	if len(os.Args) > 1 && os.Args[1] == vm.AgentArg {
		os.Exit(vm.RunAgent(os.Args[2:]))
	}
	// Libraries that log through controller-runtime's logger or klog: keep
	// them quiet (the endpoint logs to a file in the demo's directory).
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	interactive := os.Getenv("CI") != "true" && isTerminal(os.Stdin)
	if err := run(ctx, os.Stdout, interactive); err != nil {
		var se *step.Error
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
