package xds

import (
	"context"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/embark-mesh/embark/registry"
)

// CertificateCaller is a sidecar whose certificate request was authorized.
type CertificateCaller struct {
	// Registration the sidecar's token is bound to.
	Registration types.NamespacedName
	// ServiceAccount the token authenticates as: the identity istiod
	// certifies.
	ServiceAccount types.NamespacedName
	// Token is the caller's bearer token, to be presented to istiod.
	Token string
	// Expires is the token's exp: deleting the registration voids the
	// token, so a certificate that ends no later is revoked with it.
	Expires time.Time
}

// AuthorizeCertificate authenticates the caller of a certificate request
// (istio.v1.auth.IstioCertificateService) exactly as an ADS stream's: its
// `authorization: Bearer` token is reviewed for this server's audience and
// must be bound to the credential Secret of a live registration that runs as
// the token's service account. A deleted registration's token is refused
// (its Secret is gone). Errors carry gRPC status codes (Unauthenticated,
// PermissionDenied, Unavailable).
func (s *Server) AuthorizeCertificate(ctx context.Context) (*CertificateCaller, error) {
	raw, cred, err := s.authenticated(ctx, "certificate request")
	if err != nil {
		return nil, err
	}
	secret := &corev1.Secret{}
	ns := cred.ServiceAccount.Namespace
	if err := s.served(ns); err != nil {
		return nil, err
	}
	if err := s.get(ctx, types.NamespacedName{Namespace: ns, Name: cred.SecretName}, secret); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, refuse(codes.PermissionDenied, reasonStaleCredential, "the sidecar credential Secret %s/%s does not exist; onboard again", ns, cred.SecretName)
		}
		return nil, refuse(codes.Unavailable, reasonUnavailable, "read Secret %s/%s: %v", ns, cred.SecretName, err)
	}
	ref := metav1.GetControllerOf(secret)
	if ref == nil || ref.Kind != "WorkloadAutoRegistration" || registry.SidecarSecretName(ref.Name) != cred.SecretName {
		return nil, refuse(codes.PermissionDenied, reasonStaleCredential, "Secret %s/%s is not a registration's sidecar credential", ns, cred.SecretName)
	}
	key := types.NamespacedName{Namespace: ns, Name: ref.Name}
	if _, err := s.credentialRegistration(ctx, cred, key); err != nil {
		s.log.Info("refused certificate request", "registration", key.String(), "serviceAccount", cred.ServiceAccount.String(), "reason", err.Error())
		return nil, err
	}
	return &CertificateCaller{Registration: key, ServiceAccount: cred.ServiceAccount, Token: raw, Expires: cred.Expires}, nil
}

// served refuses a namespace outside Options.Namespaces: the cache does
// not watch it, so its registrations can never be found there.
func (s *Server) served(ns string) error {
	if len(s.opts.Namespaces) == 0 || slices.Contains(s.opts.Namespaces, ns) {
		return nil
	}
	return refuse(codes.PermissionDenied, reasonNamespaceNotServed, "namespace %q is not one of this endpoint's workload namespaces (workloadNamespaces)", ns)
}
