package endpoint

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/token"
	"github.com/embark-mesh/embark/registry"
)

// AzureVerifier verifies Azure VM managed identity tokens (azure.Verifier).
// VerifyRenewal accepts a token already used only when renewal accepts the
// identity it proves.
type AzureVerifier interface {
	Verify(ctx context.Context, token string) (*identity.Identity, error)
	VerifyRenewal(ctx context.Context, token string, renewal func(*identity.Identity) error) (*identity.Identity, error)
}

// azureRenewal returns the check that lets an Azure token already used
// authorize once more: Azure's Instance Metadata Service hands a VM's
// cached token to every request for most of its 24 hours, so the agent's
// renewal of its onboarding token re-presents the token it onboarded with.
// The re-presented token is accepted only from the agent that used it: the
// request carries an unexpired onboarding token of this endpoint for the
// same WorkloadGroup and the same VM (tenant, subscription, resource group,
// name and principal) and the agent's session key: the one the onboarding
// token is bound to, if it is bound, and the one the VM's registration is
// bound to while it exists. When the registration is gone (deleted, the
// agent onboards again), the onboarding token must be bound to the
// session: it is the only record of it left.
func (s *Server) azureRenewal(ctx context.Context, ns, group string) func(*identity.Identity) error {
	return func(id *identity.Identity) error {
		err := s.checkAzureRenewal(ctx, ns, group, APIIdentity(id))
		if err == nil {
			s.log.Info("accepted a re-presented Azure managed identity token as its agent's renewal",
				"group", ns+"/"+group, "vm", id.Azure.VMName, "resourceGroup", id.Azure.ResourceGroup)
		}
		return err
	}
}

// checkAzureRenewal is azureRenewal's check of the request's session.
func (s *Server) checkAzureRenewal(ctx context.Context, ns, group string, vm runtimev1alpha1.WorkloadIdentity) error {
	raw, err := bearer(ctx)
	if err != nil {
		return errors.New("the request carries no onboarding token of the agent's session")
	}
	claims, err := s.opts.Tokens.Verify(raw)
	if err != nil {
		return fmt.Errorf("its onboarding token is refused: %w", err)
	}
	if claims.Workload.WorkloadGroup != ns+"/"+group {
		return fmt.Errorf("its onboarding token is for WorkloadGroup %s, not %s/%s", claims.Workload.WorkloadGroup, ns, group)
	}
	if v := claims.Workload.Verified; v == nil || !sameAzureVM(v.Azure, vm.Azure) {
		return errors.New("its onboarding token is another workload's")
	}
	key := sessionKey(ctx)
	if key == "" {
		return errors.New("the request carries no session key")
	}
	if claims.SessionHash != "" && registry.SessionHash(key) != claims.SessionHash {
		return errors.New("its onboarding token is bound to another agent session")
	}
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	name := registry.Name(group, vm)
	err = s.opts.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, war)
	switch {
	case apierrors.IsNotFound(err):
		return boundWithoutRegistration(claims, ns, name, "does not exist")
	case err != nil:
		return fmt.Errorf("read registration %s/%s: %w", ns, name, err)
	case !war.DeletionTimestamp.IsZero():
		return boundWithoutRegistration(claims, ns, name, "is being deleted")
	}
	if !sameAzureVM(war.Spec.Identity.Azure, vm.Azure) {
		return fmt.Errorf("%w: %s/%s", registry.ErrOtherWorkload, ns, name)
	}
	return registry.CheckHolder(war, vm, key)
}

// boundWithoutRegistration is the check of a session whose registration
// ns/name is gone (state says how): the onboarding token must be bound to
// the session, whose key the caller compared with the binding already.
func boundWithoutRegistration(claims *token.Claims, ns, name, state string) error {
	if claims.SessionHash == "" {
		return fmt.Errorf("registration %s/%s %s and its onboarding token is bound to no agent session", ns, name, state)
	}
	return nil
}

// sameAzureVM says whether a and b are the same VM and managed identity:
// a VM deleted and created again under its name has another principal.
func sameAzureVM(a, b *runtimev1alpha1.AzureIdentity) bool {
	return a != nil && b != nil && a.TenantID == b.TenantID && a.SubscriptionID == b.SubscriptionID &&
		a.ResourceGroup == b.ResourceGroup && a.VMName == b.VMName && a.PrincipalID == b.PrincipalID
}
