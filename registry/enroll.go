package registry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// Errors of Enroll and CheckHolder, on top of Write's; the onboarding
// endpoint maps them to gRPC codes.
var (
	// ErrWorkloadGroupNotFound: the WorkloadGroup the workload was
	// authorized for no longer exists.
	ErrWorkloadGroupNotFound = errors.New("WorkloadGroup not found")
	// ErrAddressNotProven: a host address (the workload address or another)
	// is neither proven by the identity nor listed in the addressCIDRs of a
	// policy rule allowing the workload.
	ErrAddressNotProven = errors.New("host address not proven")
	// ErrOtherWorkload: the registration holds another workload's identity.
	ErrOtherWorkload = errors.New("registration belongs to another workload")
	// ErrWrongSession: the request's session key is missing or is not the
	// one the registration is bound to (AnnotationSessionHash).
	ErrWrongSession = errors.New("registration is bound to another agent session")
)

// PolicyError is an error of the Policy an Enroll checked, returned as it
// is (its Error is the policy's), so that the caller can tell a policy's
// refusal from the registry's own.
type PolicyError struct{ Err error }

func (e *PolicyError) Error() string { return e.Err.Error() }
func (e *PolicyError) Unwrap() error { return e.Err }

// Policy is what the OnboardingPolicies say at the time of a Register (the
// onboarding endpoint adapts its policy.Authorizer). The registry does not
// import the policy package: it only asks.
type Policy interface {
	// Allow returns nil when the policies allow id to join
	// namespace/group now, or an error saying why not.
	Allow(ctx context.Context, namespace, group string, id runtimev1alpha1.WorkloadIdentity) error
	// AllowsAddress reports whether a rule allowing id lists addr in its
	// addressCIDRs.
	AllowsAddress(ctx context.Context, namespace, group string, id runtimev1alpha1.WorkloadIdentity, addr netip.Addr) (bool, error)
}

// Enrollment is one Register of the onboarding API: what the workload's
// onboarding token says (verified by the endpoint) and what it reported.
type Enrollment struct {
	// Namespace and Group name the WorkloadGroup the token was issued for.
	Namespace, Group string
	// Identity is the token's verified identity.
	Identity runtimev1alpha1.WorkloadIdentity
	// ProvenAddress is the address the identity proves, canonical (an EC2
	// document's signed privateIp, a confirmed ECS task's ENI address, a
	// confirmed GCE instance's nic0 address); "" when it proves none.
	ProvenAddress string
	// Registration is what the workload reported, its addresses in
	// canonical form.
	Registration runtimev1alpha1.Registration
	// SessionHash is SessionHash of the agent's session key (see
	// Request.SessionHash).
	SessionHash string
	// AgentError is the agent's last failed onboarding attempt as it
	// reported it (see Request.AgentError); nil when it reported none.
	AgentError *runtimev1alpha1.AgentError
}

// Enroll registers a workload for the onboarding endpoint, applying the
// registry's rules in this order: the policies are asked again (they may
// have changed since the token was issued; a refusal is a *PolicyError);
// the WorkloadGroup is read from the cache (ErrWorkloadGroupNotFound); what
// the workload reported is validated against it (ErrInvalidRegistration);
// every host address must be proven by the identity or allowed by a
// policy's addressCIDRs (ErrAddressNotProven); then Write writes, reusing
// a registration of the same session, or of another session when the
// identity carries a fresh proof (FreshProof; else ErrSessionMismatch), and
// fencing older registrations only for a workload address the identity
// proves.
func (r *Registrar) Enroll(ctx context.Context, e Enrollment, policy Policy) (*Result, error) {
	if policy == nil {
		return nil, errors.New("registry: Enroll needs a Policy")
	}
	if err := policy.Allow(ctx, e.Namespace, e.Group, e.Identity); err != nil {
		return nil, &PolicyError{Err: err}
	}
	group := &istionetworkingv1.WorkloadGroup{}
	if err := r.cache.Get(ctx, types.NamespacedName{Namespace: e.Namespace, Name: e.Group}, group); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w: WorkloadGroup %s/%s does not exist", ErrWorkloadGroupNotFound, e.Namespace, e.Group)
		}
		return nil, fmt.Errorf("read WorkloadGroup %s/%s: %w", e.Namespace, e.Group, err)
	}
	if errs := ValidateRegistration(e.Registration, group); len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRegistration, errs.ToAggregate())
	}
	proven, err := proveAddresses(ctx, e, policy)
	if err != nil {
		return nil, err
	}
	return r.Write(ctx, Request{
		Group: group, Identity: e.Identity, Registration: e.Registration,
		SessionHash: e.SessionHash, Takeover: FreshProof(e.Identity), AddressProven: proven,
		AgentError: e.AgentError,
	})
}

// proveAddresses decides whether the host addresses of e may be stored:
// each must be proven by the identity (identityProves) or listed in the
// addressCIDRs of a policy rule allowing the workload. Every stored address
// is one the workload may be taken for, so the first that is neither is
// refused (ErrAddressNotProven, naming registration.host.addresses[i].ip),
// whether it is the workload address or an extra one. It returns whether
// the workload address (the first of the settings.connectedOver type, see
// WorkloadAddress) is proven by the identity itself, not only allowed: only
// such an address fences older holders.
func proveAddresses(ctx context.Context, e Enrollment, policy Policy) (bool, error) {
	want := e.Registration.Settings.ConnectedOver
	if want == "" {
		want = runtimev1alpha1.AddressTypeVPC
	}
	workload, found := false, false
	for i, a := range e.Registration.Host.Addresses {
		addr, err := netip.ParseAddr(a.IP)
		if err != nil {
			return false, fmt.Errorf("%w: registration.host.addresses[%d].ip %q: %w", ErrInvalidRegistration, i, a.IP, err)
		}
		byIdentity := identityProves(e, a.Type, addr)
		if a.Type == want && !found {
			workload, found = byIdentity, true
		}
		if byIdentity {
			continue
		}
		ok, err := policy.AllowsAddress(ctx, e.Namespace, e.Group, e.Identity, addr)
		if err != nil {
			return false, &PolicyError{Err: err}
		}
		if !ok {
			return false, notProven(e, i, a.Type, addr)
		}
	}
	return workload, nil
}

// identityProves says whether the identity of e proves addr as an address
// of type typ: an EC2 instance identity document proves its signed
// privateIp, as a VPC address, and nothing else; an ECS task the ECS API
// confirmed proves its ENI's private address, a GCE instance the Compute
// API confirmed its primary interface's internal address, and an Azure VM
// Azure Resource Manager confirmed its primary network interface's private
// address, as a VPC address; a JWT proves no address.
func identityProves(e Enrollment, typ runtimev1alpha1.AddressType, addr netip.Addr) bool {
	proving := e.Identity.AWS != nil || (e.Identity.ECS != nil && e.Identity.ECS.TaskConfirmed) ||
		(e.Identity.GCP != nil && e.Identity.GCP.InstanceConfirmed) ||
		(e.Identity.Azure != nil && e.Identity.Azure.VMConfirmed)
	return proving && typ == runtimev1alpha1.AddressTypeVPC && e.ProvenAddress != "" && e.ProvenAddress == addr.String()
}

// notProven is the refusal of host address i of e.
func notProven(e Enrollment, i int, typ runtimev1alpha1.AddressType, addr netip.Addr) error {
	what := "its identity proves no address (a JWT host)"
	switch ecs, gcp, az := e.Identity.ECS, e.Identity.GCP, e.Identity.Azure; {
	case e.Identity.AWS != nil:
		what = fmt.Sprintf("its instance identity document proves only the VPC address %s", e.ProvenAddress)
	case ecs != nil && ecs.TaskConfirmed:
		what = fmt.Sprintf("the ECS API confirmed only the task's ENI address %s (VPC)", e.ProvenAddress)
	case ecs != nil:
		what = "its identity proves no address (the ECS task was not confirmed by the ECS API: identity.ecs.taskCheck is not configured)"
	case gcp != nil && gcp.InstanceConfirmed:
		what = fmt.Sprintf("the Compute API confirmed only the instance's nic0 address %s (VPC)", e.ProvenAddress)
	case gcp != nil:
		what = "its identity proves no address (a GCE instance not confirmed by the Compute API: identity.gce.instanceCheck is not configured)"
	case az != nil && az.VMConfirmed:
		what = fmt.Sprintf("Azure Resource Manager confirmed only the Azure VM's primary network interface address %s (VPC)", e.ProvenAddress)
	case az != nil:
		what = "its identity proves no address (an Azure VM not confirmed by Azure Resource Manager: identity.azure.vmCheck is not configured)"
	}
	return fmt.Errorf("%w: registration.host.addresses[%d].ip: address %s (%s) is not proven: %s, and no OnboardingPolicy rule allowing it in namespace %s lists it in addressCIDRs",
		ErrAddressNotProven, i, addr, typ, what, e.Namespace)
}

// SessionHash is what a registration stores of an agent's session key
// (AnnotationSessionHash): its hex SHA-256.
func SessionHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// CheckHolder refuses a request about war (renewing its sidecar token,
// unregistering) from a workload whose verified identity is not war's
// (ErrOtherWorkload), or whose session key is not the one war is bound to
// (ErrWrongSession).
func CheckHolder(war *runtimev1alpha1.WorkloadAutoRegistration, id runtimev1alpha1.WorkloadIdentity, sessionKey string) error {
	if !SameWorkload(war.Spec.Identity, id) {
		return fmt.Errorf("%w: %s/%s", ErrOtherWorkload, war.Namespace, war.Name)
	}
	want := war.Annotations[AnnotationSessionHash]
	if want == "" || sessionKey == "" || SessionHash(sessionKey) != want {
		return fmt.Errorf("%w: %s/%s", ErrWrongSession, war.Namespace, war.Name)
	}
	return nil
}

// FreshProof says whether the identity carries a proof that may take an
// existing registration over from another agent session: an STS proof of
// the instance's role session, a JWT (short-lived, issued to the host), a
// GCE instance identity token (short-lived, signed by Google, used once),
// an Azure managed identity token (issued to the VM by Entra ID, used
// once) or an ECS task role session's STS proof (fresh, used once).
// A bare instance identity document, which never expires and which anything
// on the instance can read, never does.
func FreshProof(id runtimev1alpha1.WorkloadIdentity) bool {
	switch {
	case id.JWT != nil, id.GCP != nil, id.Azure != nil, id.ECS != nil:
		return true
	case id.AWS != nil && id.AWS.EC2 != nil:
		return id.AWS.EC2.IAMRole != ""
	default:
		return false
	}
}

// SameWorkload says whether a and b are the same workload: the same EC2
// instance (partition, account, zone, instance ID), the same GCE instance
// (project, zone, instance ID), the same Azure VM (tenant, subscription,
// resource group and name: one resource ID names one VM at a time), the
// same ECS task (partition, account, region, cluster, task ID) or the same
// JWT issuer and subject. Registration names are not compared: they are labels.
func SameWorkload(a, b runtimev1alpha1.WorkloadIdentity) bool {
	switch {
	case a.AWS != nil && b.AWS != nil:
		x, y := a.AWS, b.AWS
		if x.Partition != y.Partition || x.Account != y.Account || x.Zone != y.Zone || (x.EC2 == nil) != (y.EC2 == nil) {
			return false
		}
		return x.EC2 == nil || x.EC2.InstanceID == y.EC2.InstanceID
	case a.JWT != nil && b.JWT != nil:
		return a.JWT.Issuer == b.JWT.Issuer && a.JWT.Subject == b.JWT.Subject
	case a.GCP != nil && b.GCP != nil:
		return a.GCP.ProjectID == b.GCP.ProjectID && a.GCP.Zone == b.GCP.Zone && a.GCP.InstanceID == b.GCP.InstanceID
	case a.Azure != nil && b.Azure != nil:
		x, y := a.Azure, b.Azure
		return x.TenantID == y.TenantID && x.SubscriptionID == y.SubscriptionID && x.ResourceGroup == y.ResourceGroup && x.VMName == y.VMName
	case a.ECS != nil && b.ECS != nil:
		x, y := a.ECS, b.ECS
		return x.Partition == y.Partition && x.Account == y.Account && x.Region == y.Region && x.Cluster == y.Cluster && x.TaskID == y.TaskID
	default:
		return false
	}
}
