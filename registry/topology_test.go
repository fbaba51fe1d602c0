package registry

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	istioapi "istio.io/api/networking/v1alpha3"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/fixtures"
)

// twoNetworks is the mesh of docs/multi-network.md: pods on kube-network
// (10.244.0.0/16), and one VM network with a gateway.
var twoNetworks = &Topology{PodNetwork: "kube-network", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
	GatewayNetworks: []string{"vm-gateway-network"}}

func TestCheckTopology(t *testing.T) {
	group := func(network string, templateLabels, metadataLabels map[string]string) *istioapi.WorkloadGroup {
		g := &istioapi.WorkloadGroup{Template: &istioapi.WorkloadEntry{Network: network, Labels: templateLabels}}
		if metadataLabels != nil {
			g.Metadata = &istioapi.WorkloadGroup_ObjectMeta{Labels: metadataLabels}
		}
		return g
	}
	for _, tc := range []struct {
		name        string
		topo        *Topology
		group       *istioapi.WorkloadGroup
		address     string
		wantReasons []string
		wantIn      string // a part of the first message
	}{
		{name: "no topology, one network", group: group("", nil, nil), address: "10.244.1.1"},
		{name: "no topology, a network", group: group("virtual-machines", nil, nil), address: "10.0.0.1"},
		{name: "pods' network", topo: twoNetworks, group: group("kube-network", nil, nil), address: "10.244.1.1"},
		{name: "network with a gateway", topo: twoNetworks, group: group("vm-gateway-network", nil, nil), address: "10.0.0.1"},
		{name: "empty network: one network", topo: twoNetworks, group: group("", nil, nil), address: "10.0.0.1"},
		{name: "network without a gateway", topo: twoNetworks, group: group("virtual-machine", nil, nil), address: "10.0.0.1",
			wantReasons: []string{ReasonNoNetworkGateway}, wantIn: `network "virtual-machine" has no gateway Embark knows of (networks with one: kube-network (vmgateway), vm-gateway-network): pods are sent this workload's own address 10.0.0.1`},
		{name: "pod address on another network", topo: twoNetworks, group: group("vm-gateway-network", nil, nil), address: "10.244.7.9",
			wantReasons: []string{ReasonAddressInPodNetwork}, wantIn: `address 10.244.7.9 is in the pods' CIDR 10.244.0.0/16 (network "kube-network") but the group puts the workload on network "vm-gateway-network"`},
		{name: "pod address on the pods' network", topo: twoNetworks, group: group("kube-network", nil, nil), address: "10.244.7.9"},
		{name: "template label contradicts the network, no topology", group: group("virtual-machines", map[string]string{LabelNetwork: "kube-network"}, nil), address: "10.0.0.1",
			wantReasons: []string{ReasonNetworkLabelContradicts}, wantIn: `spec.template.labels set topology.istio.io/network="kube-network" but its spec.template.network is "virtual-machines"`},
		{name: "metadata label contradicts an empty network", group: group("", nil, map[string]string{LabelNetwork: "virtual-machines"}), address: "10.0.0.1",
			wantReasons: []string{ReasonNetworkLabelContradicts}, wantIn: `spec.metadata.labels set`},
		{name: "label agrees", group: group("virtual-machines", map[string]string{LabelNetwork: "virtual-machines"}, nil), address: "10.0.0.1"},
		{name: "everything wrong", topo: twoNetworks, group: group("elsewhere", map[string]string{LabelNetwork: "kube-network"}, nil), address: "10.244.0.3",
			wantReasons: []string{ReasonNetworkLabelContradicts, ReasonNoNetworkGateway, ReasonAddressInPodNetwork}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := CheckTopology(tc.topo, tc.group, tc.address)
			var reasons []string
			for _, p := range got {
				reasons = append(reasons, p.Reason)
			}
			if strings.Join(reasons, ",") != strings.Join(tc.wantReasons, ",") {
				t.Fatalf("reasons %v, want %v (%+v)", reasons, tc.wantReasons, got)
			}
			if tc.wantIn != "" && !strings.Contains(got[0].Message, tc.wantIn) {
				t.Errorf("message %q lacks %q", got[0].Message, tc.wantIn)
			}
		})
	}
}

// A registration's NetworkTopology condition, against the real API server:
// False with a Warning Event saying what is wrong, True where the network
// fits, absent in a single-network mesh; registering again with nothing
// changed writes and records nothing more.
func TestRegisterWritesNetworkTopology(t *testing.T) {
	for _, tc := range []struct {
		name       string
		topo       *Topology
		network    string
		labels     map[string]string
		address    string
		wantStatus metav1.ConditionStatus // "": no condition
		wantReason string
		wantIn     string
	}{
		{name: "network without a gateway", topo: twoNetworks, network: "virtual-machines", address: "10.0.0.5",
			wantStatus: metav1.ConditionFalse, wantReason: ReasonNoNetworkGateway, wantIn: `network "virtual-machines" has no gateway`},
		{name: "network with a gateway", topo: twoNetworks, network: "vm-gateway-network", address: "10.0.0.5",
			wantStatus: metav1.ConditionTrue, wantReason: ReasonNetworkConsistent},
		{name: "pod address on the VM network", topo: twoNetworks, network: "vm-gateway-network", address: "10.244.3.3",
			wantStatus: metav1.ConditionFalse, wantReason: ReasonAddressInPodNetwork, wantIn: "10.244.0.0/16"},
		{name: "label contradicts the group, no topology", network: "virtual-machines", labels: map[string]string{LabelNetwork: "kube-network"}, address: "10.0.0.5",
			wantStatus: metav1.ConditionFalse, wantReason: ReasonNetworkLabelContradicts, wantIn: `topology.istio.io/network="kube-network"`},
		{name: "single network, no topology", network: "virtual-machines", address: "10.0.0.5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			ns := env.Namespace(t)
			wg := fixtures.SeedGroup(ns)
			wg.Spec.Template.Network = tc.network
			for k, v := range tc.labels {
				wg.Spec.Template.Labels[k] = v
			}
			fixtures.CreateGroup(ctx, t, env.Client, wg)
			rec := &countingRecorder{EventRecorder: recorder, reasons: map[string]int{}}
			r, err := NewRegistrar(Options{Client: env.Client, Cache: cached, Recorder: rec, Logger: fixtures.Logger(t), Topology: tc.topo})
			if err != nil {
				t.Fatal(err)
			}
			req := Request{Group: wg, Identity: fixtures.AWSIdentity(fixtures.InstanceID), Registration: fixtures.Registration(tc.address)}
			res, err := r.Write(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			key := client.ObjectKeyFromObject(res.Registration)
			cond := networkTopology(t, key)
			if tc.wantStatus == "" {
				if cond != nil {
					t.Fatalf("NetworkTopology condition %+v in a single-network mesh, want none", cond)
				}
				return
			}
			if cond == nil || cond.Status != tc.wantStatus || cond.Reason != tc.wantReason || !strings.Contains(cond.Message, tc.wantIn) {
				t.Fatalf("NetworkTopology condition %+v, want %s/%s mentioning %q", cond, tc.wantStatus, tc.wantReason, tc.wantIn)
			}
			if tc.wantStatus == metav1.ConditionFalse {
				fixtures.WaitEvent(t, env.Client, ns, key.Name, tc.wantReason, tc.wantIn)
			}

			if _, err := r.Write(ctx, req); err != nil {
				t.Fatal(err)
			}
			if again := networkTopology(t, key); !again.LastTransitionTime.Equal(&cond.LastTransitionTime) || again.Message != cond.Message {
				t.Errorf("registering again rewrote the condition: %+v, was %+v", again, cond)
			}
			if n := rec.count(tc.wantReason); tc.wantStatus == metav1.ConditionFalse && n != 1 {
				t.Errorf("%d %s Events recorded, want 1: the condition changed once", n, tc.wantReason)
			}
		})
	}
}

func networkTopology(t *testing.T, key client.ObjectKey) *metav1.Condition {
	t.Helper()
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := env.Client.Get(t.Context(), key, war); err != nil {
		t.Fatal(err)
	}
	return meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionNetworkTopology)
}

// countingRecorder counts the Events recorded through it by reason and
// records them with the real recorder.
type countingRecorder struct {
	record.EventRecorder
	mu      sync.Mutex
	reasons map[string]int
}

func (c *countingRecorder) Event(obj runtime.Object, typ, reason, msg string) {
	c.mu.Lock()
	c.reasons[reason]++
	c.mu.Unlock()
	c.EventRecorder.Event(obj, typ, reason, msg)
}

func (c *countingRecorder) Eventf(obj runtime.Object, typ, reason, format string, args ...any) {
	c.Event(obj, typ, reason, fmt.Sprintf(format, args...))
}

func (c *countingRecorder) count(reason string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reasons[reason]
}
