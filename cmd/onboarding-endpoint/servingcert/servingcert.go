// Package servingcert keeps the onboarding endpoint's TLS serving certificate
// current: from PEM files (controller-runtime's certwatcher: file events and
// a poll) or from a Kubernetes TLS Secret (watched), swapped atomically so
// that new handshakes use the new certificate without a restart. A bad new
// certificate is logged and the last good one stays in use.
package servingcert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
)

// Source holds the current certificate.
type Source struct {
	cert  atomic.Pointer[tls.Certificate] // from a Secret
	files *certwatcher.CertWatcher        // from files
	log   *slog.Logger
}

func (s *Source) load() *tls.Certificate {
	if s.files != nil {
		c, _ := s.files.GetCertificate(nil) // never fails
		return c
	}
	return s.cert.Load()
}

// GetCertificate is tls.Config.GetCertificate.
func (s *Source) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c := s.load()
	if c == nil {
		return nil, errors.New("no serving certificate loaded yet")
	}
	return c, nil
}

// TLSConfig returns a server TLS configuration (TLS 1.2+) that uses the
// current certificate.
func (s *Source) TLSConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: s.GetCertificate}
}

// Current returns the current certificate's leaf, or nil.
func (s *Source) Current() *x509.Certificate {
	if c := s.load(); c != nil {
		return c.Leaf
	}
	return nil
}

func (s *Source) set(certPEM, keyPEM []byte, from string) error {
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("load serving certificate from %s: %w", from, err)
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return fmt.Errorf("parse serving certificate from %s: %w", from, err)
		}
	}
	prev := s.cert.Swap(&c)
	if prev == nil || prev.Leaf.SerialNumber.Cmp(c.Leaf.SerialNumber) != 0 {
		s.log.Info("serving certificate loaded", "from", from, "subject", c.Leaf.Subject.String(), "notAfter", c.Leaf.NotAfter)
	}
	return nil
}

// FromFiles loads certFile and keyFile and reloads them while ctx lives,
// through controller-runtime's certwatcher: on file events, and every
// interval in case an event was missed (default interval 10s). It fails
// when the first load fails. A pair that does not load is logged (by
// certwatcher, through controller-runtime's logger) and the previous one
// stays in use.
func FromFiles(ctx context.Context, certFile, keyFile string, interval time.Duration, log *slog.Logger) (*Source, error) {
	if log == nil {
		log = slog.Default()
	}
	if interval <= 0 {
		interval = 10 * time.Second
	}
	cw, err := certwatcher.New(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load serving certificate from %s: %w", certFile, err)
	}
	s := &Source{files: cw.WithWatchInterval(interval), log: log}
	var serial atomic.Pointer[big.Int]
	logLoaded := func(c tls.Certificate) {
		if c.Leaf == nil {
			return
		}
		if prev := serial.Swap(c.Leaf.SerialNumber); prev == nil || prev.Cmp(c.Leaf.SerialNumber) != 0 {
			log.Info("serving certificate loaded", "from", certFile, "subject", c.Leaf.Subject.String(), "notAfter", c.Leaf.NotAfter)
		}
	}
	cw.RegisterCallback(logLoaded) // called at once with the first pair
	go func() {
		if err := cw.Start(ctx); err != nil {
			log.Error("watch the serving certificate files; they are no longer reloaded", "cert", certFile, "key", keyFile, "error", err)
		}
	}()
	return s, nil
}

// FromSecret watches the kubernetes.io/tls Secret namespace/name and serves
// its tls.crt and tls.key. It waits until the Secret was loaded once (or ctx
// ends).
func FromSecret(ctx context.Context, cs kubernetes.Interface, namespace, name string, log *slog.Logger) (*Source, error) {
	if log == nil {
		log = slog.Default()
	}
	s := &Source{log: log}
	from := "Secret " + namespace + "/" + name
	lw := cache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "secrets", namespace, fields.OneTermEqualSelector("metadata.name", name))
	inf := cache.NewSharedIndexInformer(lw, &corev1.Secret{}, 0, cache.Indexers{})
	loaded := make(chan struct{})
	var once atomic.Bool
	apply := func(obj any) {
		sec, ok := obj.(*corev1.Secret)
		if !ok {
			return
		}
		if err := s.set(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey], from); err != nil {
			log.Error("serving certificate Secret is not usable; keeping the previous certificate", "secret", namespace+"/"+name, "error", err)
			return
		}
		if once.CompareAndSwap(false, true) {
			close(loaded)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    apply,
		UpdateFunc: func(_, obj any) { apply(obj) },
		DeleteFunc: func(any) {
			log.Warn("serving certificate Secret deleted; keeping the current certificate", "secret", namespace+"/"+name)
		},
	}); err != nil {
		return nil, fmt.Errorf("watch %s: %w", from, err)
	}
	go inf.RunWithContext(ctx)
	select {
	case <-loaded:
		return s, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for a usable serving certificate in %s: %w", from, ctx.Err())
	}
}
