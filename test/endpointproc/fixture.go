package endpointproc

import (
	"context"
	"fmt"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/registry"
	"github.com/embark-mesh/embark/test/fixtures"
)

// Group is the WorkloadGroup the fixture's agents onboard to.
const Group = fixtures.GroupName

// CreateFixture creates, in namespace, the WorkloadGroup "ratings", its
// service account and an OnboardingPolicy allowing every EC2 instance of
// account 123456789012 (the simulated instances' account).
func CreateFixture(ctx context.Context, c client.Client, namespace string) error {
	pol := &authorizationv1alpha1.OnboardingPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "any-ec2", Namespace: namespace},
		Spec: authorizationv1alpha1.OnboardingPolicySpec{Allow: []authorizationv1alpha1.AllowRule{{
			Workloads: []authorizationv1alpha1.WorkloadMatcher{{AWS: &authorizationv1alpha1.AWSMatcher{Accounts: []string{fixtures.Account}, EC2: &authorizationv1alpha1.EC2Matcher{}}}},
			OnboardTo: []authorizationv1alpha1.OnboardTarget{{}},
		}}},
	}
	if err := fixtures.Create(ctx, c, fixtures.SeedGroup(namespace)); err != nil {
		return err
	}
	if err := c.Create(ctx, pol); err != nil {
		return fmt.Errorf("create OnboardingPolicy %s: %w", pol.Name, err)
	}
	return nil
}

// Workload is the stored state of one registration.
type Workload struct {
	// UID is the registration's UID: another UID under the same name means
	// it was deleted and created again.
	UID types.UID
	// Connected is the AgentConnected condition's status ("" when unset).
	Connected metav1.ConditionStatus
	// Replica holds (or last held) the connection.
	Replica string
	// Deleting is set when the registration has a deletion timestamp.
	Deleting bool
	// WorkloadEntry says whether its WorkloadEntry exists.
	WorkloadEntry bool
	// OutOfTraffic says whether a replica took its WorkloadEntry out of
	// traffic because the sidecar did not reconnect (the entry carries
	// onboarding.tetrate.io/out-of-traffic, or Healthy False with reason
	// AgentDisconnected).
	OutOfTraffic bool
}

// Workloads reads every registration of namespace and its WorkloadEntry
// straight from the API server.
func Workloads(ctx context.Context, c client.Client, namespace string) (map[string]Workload, error) {
	wars := &runtimev1alpha1.WorkloadAutoRegistrationList{}
	if err := c.List(ctx, wars, client.InNamespace(namespace)); err != nil {
		return nil, err
	}
	wes := &istionetworkingv1.WorkloadEntryList{}
	if err := c.List(ctx, wes, client.InNamespace(namespace)); err != nil {
		return nil, err
	}
	entries, out := map[string]bool{}, map[string]bool{}
	for _, we := range wes.Items {
		entries[we.Name] = true
		c := registry.IstioCondition(we.Status.Conditions, registry.ConditionHealthy)
		out[we.Name] = we.Annotations[registry.AnnotationOutOfTraffic] != "" || c.GetReason() == runtimev1alpha1.ReasonAgentDisconnected
	}
	ws := map[string]Workload{}
	for _, war := range wars.Items {
		w := Workload{UID: war.UID, Deleting: war.DeletionTimestamp != nil, WorkloadEntry: entries[war.Name], OutOfTraffic: out[war.Name]}
		if cond := meta.FindStatusCondition(war.Status.Conditions, runtimev1alpha1.ConditionAgentConnected); cond != nil {
			w.Connected = cond.Status
		}
		if war.Status.Connection != nil {
			w.Replica = war.Status.Connection.Replica
		}
		ws[war.Name] = w
	}
	return ws, nil
}
