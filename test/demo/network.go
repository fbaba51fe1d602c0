package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/embark-mesh/embark/onboarding/identity/aws/awstest"
	"github.com/embark-mesh/embark/test/demo/check"
	"github.com/embark-mesh/embark/test/demo/istiodview"
	"github.com/embark-mesh/embark/test/demo/vm"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/meshnet"
	"github.com/embark-mesh/embark/test/testenv"
)

// The demo's mesh has two networks, declared as docs/multi-network.md says
// an operator declares them (test/meshnet, shared with test/multinetwork):
// the pods on kube-network (the label on istio-system) behind vmgateway,
// the seed group's VMs on virtual-machines (its spec.template.network).
// This file holds the networks' part of the demo.
const (
	// gatewayAddr is vmgateway's load-balancer address, the pods'
	// network's gateway (TEST-NET-3: nothing answers on it; the demo reads
	// what istiod sends, it carries no traffic).
	gatewayAddr = "203.0.113.10"
	// vmGatewayAddr is the VM network's gateway, declared in meshNetworks
	// by the last step (TEST-NET-2).
	vmGatewayAddr = "198.51.100.20"
	// productpagePort is the port of the demo's pod Service: the seed
	// Sidecar's egress port, so that the VMs' configuration from istiod
	// has its cluster (a Sidecar egress listener with a port imports only
	// the Services with that port).
	productpagePort = 8080
)

// declarePodNetwork labels istiod's namespace with the pods' network and
// creates vmgateway, that network's gateway, as the chart renders it with
// vmgateway.network, with the address its load balancer got.
func (d *demo) declarePodNetwork(ctx context.Context, out io.Writer) error {
	if err := d.kubectl(ctx, out, "label", "namespace", testenv.IstiodNamespace, meshnet.NetworkLabel+"="+meshnet.PodNetwork); err != nil {
		return err
	}
	if err := meshnet.CreateGatewayService(ctx, d.env.Client, testenv.IstiodNamespace, meshnet.PodNetwork, gatewayAddr); err != nil {
		return err
	}
	return d.showChecked(ctx, out, func(s string) error {
		return check.Contains(s, meshnet.GatewayServiceName, "LoadBalancer", gatewayAddr, "15443", meshnet.PodNetwork)
	}, "get", "service", meshnet.GatewayServiceName, "-n", testenv.IstiodNamespace, "-L", meshnet.NetworkLabel)
}

// showGateways waits until istiod's network gateways (its /debug/networkz)
// are exactly want (each as meshnet.Gateway formats it), then shows them.
func (d *demo) showGateways(ctx context.Context, out io.Writer, want ...string) error {
	slices.Sort(want)
	var got []string
	err := fixtures.Poll(ctx, pollInterval, waitFor, func() error {
		var err error
		if got, err = meshnet.Gateways(ctx, d.istiod.HTTPAddr); err != nil {
			return err
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("istiod's network gateways are %v, want %v", got, want)
		}
		return nil
	})
	fmt.Fprintf(out, "istiod's network gateways (its /debug/networkz):\n    %-18s %s\n", "NETWORK", "GATEWAY")
	for _, g := range got {
		network, addr, _ := strings.Cut(g, " ")
		fmt.Fprintf(out, "    %-18s %s\n", network, addr)
	}
	return err
}

// vmOnVMNetwork adds a VM to the seed's group, whose network is
// virtual-machines, and a pod Service on the pods' network; it shows that
// the VM's sidecar, in istiod mode through Embark, is sent the pod Service
// as vmgateway's address and port, never the pod's own address, and that
// the pod is sent the VM's own address, as the VM network declares no
// gateway.
func (d *demo) vmOnVMNetwork(ctx context.Context, out io.Writer, v *vm.VM) error {
	if err := d.showChecked(ctx, out, func(s string) error {
		return check.Column(s, "WorkloadGroup", "NAME", "NETWORK", map[string]string{"ratings": meshnet.VMNetwork})
	}, "get", "workloadgroup", "ratings", "-n", "bookinfo", "-o", "custom-columns=NAME:.metadata.name,NETWORK:.spec.template.network"); err != nil {
		return err
	}
	if err := d.createProductpage(ctx, out); err != nil {
		return err
	}
	var err error
	if v.IMDS, err = d.aws.instance(awstest.Instance{Role: "ratings-role", PrivateIP: "127.0.1.4", InstanceID: "i-0de00000000000004"}); err != nil {
		return err
	}
	d.vms = append(d.vms, v) // the demo's clean-up shuts it down
	fmt.Fprintf(out, "\n%s: instance %s, private IP %s\n", v.Name, v.IMDS.Instance().InstanceID, v.IMDS.Instance().PrivateIP)
	if err := d.startUpstreamResolver(out, v); err != nil {
		return err
	}
	if err := d.startVM(ctx, out, v); err != nil {
		return err
	}
	if err := d.showChecked(ctx, out, func(s string) error {
		return check.Column(s, "WorkloadEntry", "NAME", "NETWORK", map[string]string{v.Reg(): meshnet.VMNetwork})
	}, "get", "workloadentry", v.Reg(), "-n", "bookinfo", "-o", "custom-columns=NAME:.metadata.name,ADDRESS:.spec.address,NETWORK:.spec.network"); err != nil {
		return err
	}
	fmt.Fprintln(out)
	if err := d.showVMEndpoints(ctx, out, v); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nthe pod's side: %s has no gateway, so istiod sends the pod every VM's own address (docs/multi-network.md, \"What a pod sees of a VM\"):\n", meshnet.VMNetwork)
	if err := d.showGateways(ctx, out, meshnet.Gateway(meshnet.PodNetwork, gatewayAddr, meshnet.GatewayPort)); err != nil {
		return err
	}
	return d.showRatingsEndpoints(ctx, out, d.wantEndpoints(nil, d.removed))
}

// createProductpage creates the pod Service productpage: the Service, its
// Pod (the one whose proxy d.pod is) and the EndpointSlice Kubernetes
// writes for it.
func (d *demo) createProductpage(ctx context.Context, out io.Writer) error {
	if err := meshnet.CreatePodService(ctx, d.env.Client, meshnet.PodService{Namespace: "bookinfo", Name: "productpage", Port: productpagePort,
		PodName: istiodview.ProductpagePodName, PodIP: istiodview.ProductpagePodIP}); err != nil {
		return err
	}
	fmt.Fprintf(out, "the pod Service productpage (port %d), its Pod on %s:\n", productpagePort, meshnet.PodNetwork)
	return d.showChecked(ctx, out, func(s string) error { return check.Contains(s, istiodview.ProductpagePodIP) },
		"get", "endpointslices", "-n", "bookinfo", "-l", "kubernetes.io/service-name=productpage")
}

// productpageCluster is the outbound cluster of productpage.
func productpageCluster() string {
	return fmt.Sprintf("outbound|%d||productpage.bookinfo.svc.cluster.local", productpagePort)
}

// showVMEndpoints waits until v's sidecar was last sent productpage's
// endpoints as exactly vmgateway's address and 15443, checks that it was
// never sent the pod's own address, and shows them.
func (d *demo) showVMEndpoints(ctx context.Context, out io.Writer, v *vm.VM) error {
	cluster, gw := productpageCluster(), hostPort(gatewayAddr, meshnet.GatewayPort)
	var latest, ever []string
	err := fixtures.Poll(ctx, pollInterval, waitFor, func() error {
		var ok bool
		if latest, ever, ok = v.Endpoints(cluster); !ok {
			return fmt.Errorf("%s's sidecar has not been sent %s over EDS", v.Name, cluster)
		}
		if !slices.Equal(latest, []string{gw}) {
			return fmt.Errorf("%s's sidecar was sent %v for %s, want [%s]", v.Name, latest, cluster, gw)
		}
		return nil
	})
	fmt.Fprintf(out, "%s's sidecar's EDS (from istiod, relayed by Embark, passed on by pilot-agent), cluster %s:\n    ENDPOINT\n", v.Name, cluster)
	for _, a := range latest {
		fmt.Fprintf(out, "    %s\n", a)
	}
	if err != nil {
		return err
	}
	pod := hostPort(istiodview.ProductpagePodIP, productpagePort)
	if slices.Contains(ever, pod) {
		return fmt.Errorf("%s's sidecar was sent the pod's own address %s, which a VM on %s cannot reach", v.Name, pod, meshnet.VMNetwork)
	}
	fmt.Fprintf(out, "every endpoint it was ever sent for it: %v: vmgateway (%s), never the pod's address %s\n", ever, gw, pod)
	return nil
}

// declareVMGateway declares the VM network's gateway in meshNetworks (the
// istio ConfigMap) and shows that the pod is then sent the VMs as that
// gateway, never a VM's own address, while the VM's sidecar is still sent
// productpage as vmgateway.
func (d *demo) declareVMGateway(ctx context.Context, out io.Writer, v *vm.VM) error {
	cm := meshnet.MeshNetworksConfigMap(testenv.IstiodNamespace, meshnet.MeshNetworks(meshnet.VMNetwork, vmGatewayAddr, meshnet.GatewayPort))
	data, err := yaml.Marshal(cm)
	if err != nil {
		return err
	}
	file := filepath.Join(d.work, "meshnetworks.yaml")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		return err
	}
	fmt.Fprintf(out, "$ cat %s\n%s", file, data)
	if err := d.kubectl(ctx, out, "apply", "-f", file); err != nil {
		return err
	}
	if err := d.showGateways(ctx, out, meshnet.Gateway(meshnet.PodNetwork, gatewayAddr, meshnet.GatewayPort),
		meshnet.Gateway(meshnet.VMNetwork, vmGatewayAddr, meshnet.GatewayPort)); err != nil {
		return err
	}
	// Every VM of ratings is on the VM network: the pod is sent its
	// gateway once, weighted by the VMs behind it, and no VM's address.
	want := map[string]bool{vmGatewayAddr: true}
	for ip := range d.wantEndpoints(nil, d.removed) {
		want[ip] = false
	}
	if err := d.showRatingsEndpoints(ctx, out, want); err != nil {
		return err
	}
	got, err := d.pod.Endpoints()
	if err != nil {
		return err
	}
	if e, wantAddr := got[vmGatewayAddr], hostPort(vmGatewayAddr, meshnet.GatewayPort); e.Address != wantAddr {
		return fmt.Errorf("the pod was sent the VM network's gateway as %q, want %s", e.Address, wantAddr)
	}
	if len(got) != 1 {
		return errors.New("the pod was sent more than the VM network's gateway")
	}
	fmt.Fprintln(out)
	return d.showVMEndpoints(ctx, out, v)
}

func hostPort(host string, port int) string {
	return net.JoinHostPort(host, strconv.Itoa(port))
}
