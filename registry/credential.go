package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// The sidecar's credential (design.md, "The sidecar's credential"): each
// registration owns a Secret, and the sidecar's token is a Kubernetes
// service-account token of the WorkloadGroup's service account bound to that
// Secret. Deleting the registration deletes the Secret, which revokes every
// token bound to it at once.
const (
	// AudienceIstioCA is the audience istiod's CA accepts.
	AudienceIstioCA = "istio-ca"
	// DefaultXDSAudience is the audience Embark's xDS server accepts.
	DefaultXDSAudience = "onboarding.tetrate.io/xds"
	// DefaultSidecarTokenLifetime is how long a sidecar token is valid.
	DefaultSidecarTokenLifetime = time.Hour
	// LabelSidecarCredential marks the Secrets sidecar tokens are bound to,
	// so that a label-filtered informer sees only them.
	LabelSidecarCredential = "onboarding.tetrate.io/sidecar-credential"
	// SecretTypeSidecarCredential is the type of those Secrets. They hold no
	// data: they exist to be the tokens' bound object.
	SecretTypeSidecarCredential corev1.SecretType = "onboarding.tetrate.io/sidecar-credential"
	// minSidecarTokenLifetime is the shortest lifetime the API server grants.
	minSidecarTokenLifetime = 10 * time.Minute
)

// ErrServiceAccountMissing says that the WorkloadGroup template's service
// account does not exist. Embark never creates service accounts by itself.
var ErrServiceAccountMissing = errors.New("service account missing")

// SidecarCredentialOptions configures the sidecar's token. Zero fields take
// their defaults.
type SidecarCredentialOptions struct {
	// Audiences of the token. Default: istio-ca and DefaultXDSAudience.
	Audiences []string
	// Lifetime of a token. Default 1h; at least 10m (the API server's minimum).
	Lifetime time.Duration
	// Issued, when set, is told every sidecar token the API server issued
	// (Register, RenewSidecarToken) with its audiences, before it is
	// returned: the xDS server remembers it as reviewed
	// (tokenauth.Authenticator.Issued). It must not block.
	Issued func(token string, audiences []string)
}

func (o *SidecarCredentialOptions) setDefaults() {
	if len(o.Audiences) == 0 {
		o.Audiences = []string{AudienceIstioCA, DefaultXDSAudience}
	}
	if o.Lifetime == 0 {
		o.Lifetime = DefaultSidecarTokenLifetime
	}
	o.Lifetime = max(o.Lifetime, minSidecarTokenLifetime)
}

// SidecarToken is a token for a workload's sidecar.
type SidecarToken struct {
	// Token is the JWT the sidecar sends as `authorization: Bearer`.
	Token string
	// ExpiresAt is when it stops being valid.
	ExpiresAt time.Time
	// ServiceAccount it authenticates as (namespace/name).
	ServiceAccount types.NamespacedName
}

// SidecarSecretName returns the name of the Secret a registration's sidecar
// tokens are bound to: <registration>-sidecar, shortened when too long.
func SidecarSecretName(registration string) string {
	return Shorten(registration+"-sidecar", 0)
}

// ServiceAccountOf returns the service account of a WorkloadGroup template
// (DefaultServiceAccount when it names none).
func ServiceAccountOf(serviceAccount string) string {
	if serviceAccount == "" {
		return DefaultServiceAccount
	}
	return serviceAccount
}

// sidecarServiceAccount is the service account the sidecar of registration
// name will run as: its snapshot's when it exists (a registration keeps the
// group it joined), else the group's.
func (r *Registrar) sidecarServiceAccount(ctx context.Context, group *istionetworkingv1.WorkloadGroup, name string) types.NamespacedName {
	sa := group.Spec.GetTemplate().GetServiceAccount()
	cur := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := r.client.Get(ctx, types.NamespacedName{Namespace: group.Namespace, Name: name}, cur); err == nil {
		if spec, err := GroupSpec(cur.Spec.WorkloadGroup); err == nil {
			sa = spec.GetTemplate().GetServiceAccount()
		}
	}
	return types.NamespacedName{Namespace: group.Namespace, Name: ServiceAccountOf(sa)}
}

// checkServiceAccount fails with ErrServiceAccountMissing when the service
// account does not exist.
func (r *Registrar) checkServiceAccount(ctx context.Context, key types.NamespacedName) error {
	err := r.client.Get(ctx, key, &corev1.ServiceAccount{})
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return serviceAccountMissing(key)
	default:
		return fmt.Errorf("read ServiceAccount %s: %w", key, err)
	}
}

func serviceAccountMissing(key types.NamespacedName) error {
	return fmt.Errorf("%w: ServiceAccount %s named by the WorkloadGroup template does not exist; create it (Embark never creates service accounts)", ErrServiceAccountMissing, key)
}

// ensureSidecarSecret creates the registration's Secret, or returns the
// existing one when it belongs to this registration.
func (r *Registrar) ensureSidecarSecret(ctx context.Context, war *runtimev1alpha1.WorkloadAutoRegistration) (*corev1.Secret, error) {
	want := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      SidecarSecretName(war.Name),
			Namespace: war.Namespace,
			Labels:    map[string]string{LabelSidecarCredential: "true"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion:         runtimev1alpha1.SchemeGroupVersion.String(),
				Kind:               "WorkloadAutoRegistration",
				Name:               war.Name,
				UID:                war.UID,
				Controller:         ptr.To(true),
				BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Type: SecretTypeSidecarCredential,
	}
	var secret *corev1.Secret
	err := r.writer.Do(ctx, func(ctx context.Context) error {
		secret = want.DeepCopy()
		err := r.client.Create(ctx, secret)
		if !apierrors.IsAlreadyExists(err) {
			return err
		}
		cur := &corev1.Secret{}
		if err := r.client.Get(ctx, client.ObjectKeyFromObject(want), cur); err != nil {
			return err
		}
		if ref, ok := OwnedBy(cur.OwnerReferences, war.Name); !ok || ref.UID != war.UID {
			// Left behind by an earlier registration of the same name that
			// the garbage collector has not removed yet: try again later.
			return apierrors.NewConflict(corev1.Resource("secrets"), cur.Name, errors.New("owned by an earlier registration"))
		}
		secret = cur
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("write sidecar credential Secret %s/%s: %w", want.Namespace, want.Name, err)
	}
	return secret, nil
}

// requestSidecarToken asks the API server for a token of the registration's
// service account bound to its Secret. Nothing is stored.
func (r *Registrar) requestSidecarToken(ctx context.Context, war *runtimev1alpha1.WorkloadAutoRegistration, secret *corev1.Secret) (*SidecarToken, error) {
	group, err := GroupSpec(war.Spec.WorkloadGroup)
	if err != nil {
		return nil, err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{
		Namespace: war.Namespace, Name: ServiceAccountOf(group.GetTemplate().GetServiceAccount()),
	}}
	var tr *authenticationv1.TokenRequest
	err = r.writer.Do(ctx, func(ctx context.Context) error {
		tr = &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			Audiences:         r.sidecar.Audiences,
			ExpirationSeconds: ptr.To(int64(r.sidecar.Lifetime / time.Second)),
			BoundObjectRef: &authenticationv1.BoundObjectReference{
				APIVersion: "v1", Kind: "Secret", Name: secret.Name, UID: secret.UID,
			},
		}}
		return r.client.SubResource("token").Create(ctx, sa, tr)
	})
	if apierrors.IsNotFound(err) {
		return nil, serviceAccountMissing(client.ObjectKeyFromObject(sa))
	}
	if err != nil {
		return nil, fmt.Errorf("request a token of ServiceAccount %s/%s bound to Secret %s: %w", sa.Namespace, sa.Name, secret.Name, err)
	}
	if r.sidecar.Issued != nil {
		r.sidecar.Issued(tr.Status.Token, tr.Spec.Audiences)
	}
	return &SidecarToken{
		Token:          tr.Status.Token,
		ExpiresAt:      tr.Status.ExpirationTimestamp.Time,
		ServiceAccount: client.ObjectKeyFromObject(sa),
	}, nil
}

// ErrRegistrationNotFound says that the registration (or its sidecar Secret)
// does not exist.
var ErrRegistrationNotFound = errors.New("registration not found")

// RenewSidecarToken returns a fresh token for the sidecar of the registration
// key, bound to its existing Secret. It writes nothing. The caller has
// authorized the request (the onboarding token names this registration).
func (r *Registrar) RenewSidecarToken(ctx context.Context, key types.NamespacedName) (*SidecarToken, error) {
	war := &runtimev1alpha1.WorkloadAutoRegistration{}
	if err := r.client.Get(ctx, key, war); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w: %s", ErrRegistrationNotFound, key)
		}
		return nil, fmt.Errorf("read registration %s: %w", key, err)
	}
	if war.DeletionTimestamp != nil {
		return nil, fmt.Errorf("%w: %s is being deleted", ErrRegistrationNotFound, key)
	}
	secret := &corev1.Secret{}
	skey := types.NamespacedName{Namespace: key.Namespace, Name: SidecarSecretName(key.Name)}
	if err := r.client.Get(ctx, skey, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w: sidecar credential Secret %s of %s (register again)", ErrRegistrationNotFound, skey, key)
		}
		return nil, fmt.Errorf("read sidecar credential Secret %s: %w", skey, err)
	}
	if ref, ok := OwnedBy(secret.OwnerReferences, war.Name); !ok || ref.UID != war.UID {
		return nil, fmt.Errorf("%w: Secret %s does not belong to registration %s (register again)", ErrRegistrationNotFound, skey, key)
	}
	return r.requestSidecarToken(ctx, war, secret)
}
