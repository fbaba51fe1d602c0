package token

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// SourceOption configures a SecretKeySource.
type SourceOption func(*SecretKeySource)

// WithSourceLogger sets the logger of a SecretKeySource, which also receives
// the informer's own logs. Default: a logger that discards everything.
func WithSourceLogger(l *slog.Logger) SourceOption {
	return func(s *SecretKeySource) {
		if l != nil {
			s.log = l
		}
	}
}

// SecretKeySource is a KeySource that follows one signing-key Secret through
// an informer restricted to that Secret (namespaced list/watch with the field
// selector metadata.name=<name>; RBAC: get, list and watch on that Secret).
// Every new version of the Secret whose keys parse replaces the key set
// atomically; a version whose keys do not parse, and the deletion of the
// Secret, are logged and counted and leave the last good key set in place.
//
// Start runs the informer; it has the shape of controller-runtime's
// manager.Runnable and says through NeedLeaderElection that every replica
// runs it.
type SecretKeySource struct {
	secrets   typedcorev1.SecretsGetter
	namespace string
	name      string
	log       *slog.Logger

	set        atomic.Pointer[KeySet]
	loaded     chan struct{}
	loadedOnce sync.Once
	started    atomic.Bool
	loads      atomic.Uint64
	errs       atomic.Uint64
}

// NewSecretKeySource returns a source for the Secret namespace/name. It holds
// no keys until Start has loaded them.
func NewSecretKeySource(secrets typedcorev1.SecretsGetter, namespace, name string, opts ...SourceOption) *SecretKeySource {
	s := &SecretKeySource{
		secrets:   secrets,
		namespace: namespace,
		name:      name,
		log:       slog.New(slog.DiscardHandler),
		loaded:    make(chan struct{}),
	}
	for _, opt := range opts {
		opt(s)
	}
	s.log = s.log.With("secret", namespace+"/"+name)
	return s
}

// KeySet returns the last good key set, or nil before the first one loaded.
// It never blocks.
func (s *SecretKeySource) KeySet() *KeySet { return s.set.Load() }

// SourceStats counts what a SecretKeySource did.
type SourceStats struct {
	// Loads counts versions of the Secret whose keys were loaded.
	Loads uint64
	// Errors counts versions of the Secret refused because their keys do not
	// parse, and deletions of the Secret.
	Errors uint64
}

// Stats returns the counters, for metrics.
func (s *SecretKeySource) Stats() SourceStats {
	return SourceStats{Loads: s.loads.Load(), Errors: s.errs.Load()}
}

// NeedLeaderElection returns false: every replica needs the keys.
func (s *SecretKeySource) NeedLeaderElection() bool { return false }

// WaitForKeys blocks until a key set has been loaded or ctx ends.
func (s *SecretKeySource) WaitForKeys(ctx context.Context) error {
	select {
	case <-s.loaded:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for onboarding token signing keys from secret %s/%s: %w", s.namespace, s.name, context.Cause(ctx))
	}
}

// Start runs the informer until ctx ends. It may be called once.
func (s *SecretKeySource) Start(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("secret key source already started")
	}
	selector := fields.OneTermEqualSelector("metadata.name", s.name).String()
	secrets := s.secrets.Secrets(s.namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = selector
			return secrets.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = selector
			return secrets.Watch(ctx, opts)
		},
	}
	logger := logr.FromSlogHandler(s.log.Handler())
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		Logger:        &logger,
		ListerWatcher: lw,
		ObjectType:    &corev1.Secret{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    s.apply,
			UpdateFunc: func(_, obj any) { s.apply(obj) },
			DeleteFunc: s.deleted,
		},
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		informer.RunWithContext(klog.NewContext(ctx, logger))
	}()
	select {
	case <-informer.HasSyncedChecker().Done():
		if s.KeySet() == nil {
			s.log.Warn("onboarding token signing-key secret not found or invalid; no token can be issued until it is fixed")
		}
	case <-ctx.Done():
	}
	<-done
	return nil
}

func (s *SecretKeySource) apply(obj any) {
	secret, ok := obj.(*corev1.Secret)
	if !ok || secret.Namespace != s.namespace || secret.Name != s.name {
		return
	}
	set, err := KeySetFromSecret(secret)
	if err != nil {
		s.errs.Add(1)
		attrs := []any{"resourceVersion", secret.ResourceVersion, "error", err}
		if old := s.KeySet(); old != nil {
			attrs = append(attrs, "keptKeys", old.String())
		}
		s.log.Error("onboarding token signing-key secret holds invalid keys; keeping the previous keys", attrs...)
		return
	}
	old := s.set.Swap(set)
	s.loads.Add(1)
	s.loadedOnce.Do(func() { close(s.loaded) })
	if old == nil || old.String() != set.String() {
		s.log.Info("loaded onboarding token signing keys", "resourceVersion", secret.ResourceVersion, "keys", set.String())
	}
}

func (s *SecretKeySource) deleted(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if secret, ok := obj.(*corev1.Secret); ok && (secret.Namespace != s.namespace || secret.Name != s.name) {
		return
	}
	s.errs.Add(1)
	attrs := []any{}
	if old := s.KeySet(); old != nil {
		attrs = append(attrs, "keptKeys", old.String())
	}
	s.log.Error("onboarding token signing-key secret was deleted; keeping the last keys until it is recreated", attrs...)
}
