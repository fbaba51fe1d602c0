package registry

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	istioapi "istio.io/api/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// Reasons of the NetworkTopology condition, and of the Warning Event that
// comes with it turning False.
const (
	// ReasonNetworkConsistent (NetworkTopology=True): the workload's network
	// is the pods' or one with a gateway, and its address is not a pod's.
	ReasonNetworkConsistent = "NetworkConsistent"
	// ReasonNoNetworkGateway (False): the group's network is neither the
	// pods' network nor one with a known gateway: pods are sent the VM's own
	// address, and the name may be a typo.
	ReasonNoNetworkGateway = "NoNetworkGateway"
	// ReasonNetworkLabelContradicts (False): the group's labels carry
	// topology.istio.io/network with another value than its
	// template.network, which wins.
	ReasonNetworkLabelContradicts = "NetworkLabelContradicts"
	// ReasonAddressInPodNetwork (False): the workload's address is in the
	// pods' CIDR while its group puts it on another network.
	ReasonAddressInPodNetwork = "AddressInPodNetwork"
)

// Topology is the mesh's networks as the endpoint is configured with them
// (mesh.network); a registration's network is checked against it.
type Topology struct {
	// PodNetwork is the pods' network (the topology.istio.io/network label
	// of istiod's namespace); it has a gateway (vmgateway).
	PodNetwork string
	// PodCIDRs are the pods' addresses.
	PodCIDRs []netip.Prefix
	// GatewayNetworks are the other networks with a gateway istiod knows
	// of (meshNetworks).
	GatewayNetworks []string
}

// TopologyProblem is one way a workload's network does not fit the mesh.
type TopologyProblem struct {
	Reason  string
	Message string
}

// CheckTopology returns what is wrong with the network of a workload at
// address in group: its label contradicting template.network (always
// checked), and, when topo is set, a network with no gateway or an address
// in the pods' CIDR on another network. None: nothing is wrong.
func CheckTopology(topo *Topology, group *istioapi.WorkloadGroup, address string) []TopologyProblem {
	network := group.GetTemplate().GetNetwork()
	var out []TopologyProblem
	for _, src := range []struct {
		where  string
		labels map[string]string
	}{{"spec.template.labels", group.GetTemplate().GetLabels()}, {"spec.metadata.labels", group.GetMetadata().GetLabels()}} {
		if v, ok := src.labels[LabelNetwork]; ok && v != network {
			out = append(out, TopologyProblem{ReasonNetworkLabelContradicts, fmt.Sprintf(
				"the WorkloadGroup's %s set %s=%q but its spec.template.network is %q, which the WorkloadEntry and the sidecar carry: remove the label or set the network to it",
				src.where, LabelNetwork, v, network)})
		}
	}
	if topo == nil || network == "" || network == topo.PodNetwork {
		return out
	}
	if !slices.Contains(topo.GatewayNetworks, network) {
		known := append([]string{topo.PodNetwork + " (vmgateway)"}, topo.GatewayNetworks...)
		out = append(out, TopologyProblem{ReasonNoNetworkGateway, fmt.Sprintf(
			"network %q has no gateway Embark knows of (networks with one: %s): pods are sent this workload's own address %s, which they reach only if that network is routable from them; declare its gateway in meshNetworks and mesh.network.gateways, or fix the group's spec.template.network",
			network, strings.Join(known, ", "), address)})
	}
	if ip, err := netip.ParseAddr(address); err == nil {
		for _, p := range topo.PodCIDRs {
			if p.Contains(ip) {
				out = append(out, TopologyProblem{ReasonAddressInPodNetwork, fmt.Sprintf(
					"address %s is in the pods' CIDR %s (network %q) but the group puts the workload on network %q: istiod treats it as on %q, so the address overlaps the pods' and traffic to it may reach a pod; give the VM network a range of its own",
					address, p, topo.PodNetwork, network, network)})
				break
			}
		}
	}
	return out
}

// topologyCondition is the NetworkTopology condition of problems.
func topologyCondition(problems []TopologyProblem) metav1.Condition {
	if len(problems) == 0 {
		return metav1.Condition{Type: runtimev1alpha1.ConditionNetworkTopology, Status: metav1.ConditionTrue,
			Reason: ReasonNetworkConsistent, Message: "the workload's network fits the mesh's networks"}
	}
	msgs := make([]string, len(problems))
	for i, p := range problems {
		msgs[i] = p.Message
	}
	return metav1.Condition{Type: runtimev1alpha1.ConditionNetworkTopology, Status: metav1.ConditionFalse,
		Reason: problems[0].Reason, Message: strings.Join(msgs, "; ")}
}

// checkTopology writes the registration's NetworkTopology condition when
// it changes, with a Warning Event when it turns False or says something
// else. Without a configured topology and with nothing wrong it writes
// nothing: a single-network mesh has no such condition. Failing to write it
// is logged, not returned: the registration itself is complete.
func (r *Registrar) checkTopology(ctx context.Context, war *runtimev1alpha1.WorkloadAutoRegistration, address string) {
	cond, write, err := r.topologyConditionOf(war, address)
	if err != nil {
		r.log.Error("read the registration's WorkloadGroup snapshot", "registration", client.ObjectKeyFromObject(war).String(), "error", err)
		return
	}
	if !write {
		return
	}
	changed, err := r.setCondition(ctx, war, cond)
	if err != nil {
		if !apierrors.IsNotFound(err) {
			r.log.Error("write NetworkTopology condition", "registration", client.ObjectKeyFromObject(war).String(), "error", err)
		}
		return
	}
	if changed && cond.Status == metav1.ConditionFalse {
		r.recorder.Event(war, corev1.EventTypeWarning, cond.Reason, cond.Message)
	}
}

// topologyConditionOf returns the NetworkTopology condition of war at
// address and whether it is written: always with a topology configured,
// and without one only when the group contradicts itself or war holds the
// condition already.
func (r *Registrar) topologyConditionOf(war *runtimev1alpha1.WorkloadAutoRegistration, address string) (metav1.Condition, bool, error) {
	// The group as the registration holds it: what its WorkloadEntry is
	// built from.
	group, err := GroupSpec(war.Spec.WorkloadGroup)
	if err != nil {
		return metav1.Condition{}, false, err
	}
	problems := CheckTopology(r.topology, group, address)
	if r.topology == nil && len(problems) == 0 && meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionNetworkTopology) == nil {
		return metav1.Condition{}, false, nil
	}
	return topologyCondition(problems), true, nil
}

// setCondition sets cond on the stored registration and writes its status
// when that changed it; it reports whether it did.
func (r *Registrar) setCondition(ctx context.Context, war *runtimev1alpha1.WorkloadAutoRegistration, cond metav1.Condition) (bool, error) {
	key := client.ObjectKeyFromObject(war)
	changed := false
	err := r.writer.Do(ctx, func(ctx context.Context) error {
		cur := &runtimev1alpha1.WorkloadAutoRegistration{}
		if err := r.client.Get(ctx, key, cur); err != nil {
			return err
		}
		c := cond
		c.ObservedGeneration, c.LastTransitionTime = cur.Generation, metav1.NewTime(r.now())
		old := meta.FindStatusCondition(cur.Status.Conditions, c.Type)
		if old != nil && old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message {
			return nil
		}
		meta.SetStatusCondition(&cur.Status.Conditions, c)
		if err := r.client.Status().Update(ctx, cur); err != nil {
			return err
		}
		changed = true
		return nil
	})
	return changed, err
}
