package token

import (
	"bytes"
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"
)

// The data keys of the signing-key Secret. Each holds one PEM private key as
// ParseKeyPEM accepts it. SecretKeyCurrent is required; SecretKeyPrevious is
// optional and may be empty.
const (
	SecretKeyCurrent  = "current.pem"
	SecretKeyPrevious = "previous.pem"
)

// Labels set on the Secrets GenerateKeySecret creates.
var secretLabels = map[string]string{
	"app.kubernetes.io/part-of":    "embark",
	"app.kubernetes.io/component":  "onboarding-token-signing-key",
	"app.kubernetes.io/managed-by": "embark-onboarding-endpoint",
}

// KeySetFromSecret parses the key set of a signing-key Secret.
func KeySetFromSecret(secret *corev1.Secret) (*KeySet, error) {
	data, ok := secret.Data[SecretKeyCurrent]
	if !ok || len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("secret %s/%s has no %s", secret.Namespace, secret.Name, SecretKeyCurrent)
	}
	current, err := ParseKeyPEM(data)
	if err != nil {
		return nil, fmt.Errorf("secret %s/%s key %s: %w", secret.Namespace, secret.Name, SecretKeyCurrent, err)
	}
	var previous *Key
	if data := secret.Data[SecretKeyPrevious]; len(bytes.TrimSpace(data)) > 0 {
		if previous, err = ParseKeyPEM(data); err != nil {
			return nil, fmt.Errorf("secret %s/%s key %s: %w", secret.Namespace, secret.Name, SecretKeyPrevious, err)
		}
	}
	return NewKeySet(current, previous)
}

// GenerateKeySecret returns a new signing-key Secret (not yet created) with a
// fresh P-256 key as SecretKeyCurrent, and its key set.
func GenerateKeySecret(namespace, name string) (*corev1.Secret, *KeySet, error) {
	key, err := GenerateKey()
	if err != nil {
		return nil, nil, err
	}
	pemData, err := key.MarshalPEM()
	if err != nil {
		return nil, nil, err
	}
	set, err := NewKeySet(key, nil)
	if err != nil {
		return nil, nil, err
	}
	labels := make(map[string]string, len(secretLabels))
	for k, v := range secretLabels {
		labels[k] = v
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{SecretKeyCurrent: pemData},
	}, set, nil
}

// EnsureKeySecret returns the key set of the signing-key Secret
// namespace/name, creating the Secret with a fresh P-256 key when it does not
// exist. When another replica creates it concurrently, the Secret it created
// is read back and used. An existing Secret whose keys do not parse is an
// error; it is never overwritten.
//
// An existing Secret with no data at all (the install creates it empty, so
// that the endpoint needs no right to create Secrets in its namespace, where
// istiod's CA lives) is filled with a fresh key by an update that carries the
// resourceVersion it read; when another replica fills it first, the update
// conflicts and its key is read back and used.
func EnsureKeySecret(ctx context.Context, secrets typedcorev1.SecretsGetter, namespace, name string) (*KeySet, error) {
	existing, err := secrets.Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil && len(existing.Data) == 0:
		return fillKeySecret(ctx, secrets, existing)
	case err == nil:
		return KeySetFromSecret(existing)
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("get signing-key secret %s/%s: %w", namespace, name, err)
	}
	secret, set, err := GenerateKeySecret(namespace, name)
	if err != nil {
		return nil, err
	}
	_, err = secrets.Secrets(namespace).Create(ctx, secret, metav1.CreateOptions{})
	switch {
	case err == nil:
		return set, nil
	case !apierrors.IsAlreadyExists(err):
		return nil, fmt.Errorf("create signing-key secret %s/%s: %w", namespace, name, err)
	}
	// Another replica won the race: use its key.
	existing, err = secrets.Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get signing-key secret %s/%s created concurrently: %w", namespace, name, err)
	}
	return KeySetFromSecret(existing)
}

// fillKeySecret writes a fresh key into the empty Secret existing.
func fillKeySecret(ctx context.Context, secrets typedcorev1.SecretsGetter, existing *corev1.Secret) (*KeySet, error) {
	generated, set, err := GenerateKeySecret(existing.Namespace, existing.Name)
	if err != nil {
		return nil, err
	}
	filled := existing.DeepCopy()
	filled.Data = generated.Data
	if filled.Labels == nil {
		filled.Labels = map[string]string{}
	}
	for k, v := range generated.Labels {
		filled.Labels[k] = v
	}
	_, err = secrets.Secrets(existing.Namespace).Update(ctx, filled, metav1.UpdateOptions{})
	switch {
	case err == nil:
		return set, nil
	case !apierrors.IsConflict(err):
		return nil, fmt.Errorf("fill signing-key secret %s/%s: %w", existing.Namespace, existing.Name, err)
	}
	// Another replica filled it first: use its key.
	current, err := secrets.Secrets(existing.Namespace).Get(ctx, existing.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get signing-key secret %s/%s filled concurrently: %w", existing.Namespace, existing.Name, err)
	}
	return KeySetFromSecret(current)
}

// Rotate rotates the keys of the signing-key Secret namespace/name: the
// current key becomes the previous one (the old previous key is dropped) and
// a fresh P-256 key becomes current. The update carries the resourceVersion it
// read, so a concurrent writer makes it conflict; it then re-reads and retries
// with bounded backoff. If the re-read shows that someone else already
// rotated away from the key this call started from, Rotate does not rotate a
// second time (that would drop a key whose tokens are still valid) and
// returns the key set it found. Rotate refuses a Secret whose keys do not
// parse.
func Rotate(ctx context.Context, secrets typedcorev1.SecretsGetter, namespace, name string) (*KeySet, error) {
	var (
		startedFrom string
		result      *KeySet
	)
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		secret, err := secrets.Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get signing-key secret %s/%s: %w", namespace, name, err)
		}
		set, err := KeySetFromSecret(secret)
		if err != nil {
			return fmt.Errorf("refusing to rotate: %w", err)
		}
		if startedFrom == "" {
			startedFrom = set.Current().ID()
		} else if set.Current().ID() != startedFrom {
			result = set
			return nil
		}
		next, err := GenerateKey()
		if err != nil {
			return err
		}
		nextPEM, err := next.MarshalPEM()
		if err != nil {
			return err
		}
		updated := secret.DeepCopy()
		updated.Data[SecretKeyPrevious] = secret.Data[SecretKeyCurrent]
		updated.Data[SecretKeyCurrent] = nextPEM
		if _, err := secrets.Secrets(namespace).Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update signing-key secret %s/%s: %w", namespace, name, err)
		}
		result, err = NewKeySet(next, set.Current())
		return err
	})
	if err != nil {
		if apierrors.IsConflict(err) {
			return nil, fmt.Errorf("rotate signing keys: still conflicting after retries: %w", err)
		}
		return nil, fmt.Errorf("rotate signing keys: %w", err)
	}
	return result, nil
}
