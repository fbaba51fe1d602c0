// Package servingcert keeps the onboarding endpoint's TLS serving certificate
// current: from PEM files (polled for changes) or from a Kubernetes TLS Secret
// (watched), swapped atomically so that new handshakes use the new
// certificate without a restart. A bad new certificate is logged and the last
// good one stays in use.
package servingcert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Source holds the current certificate.
type Source struct {
	cert atomic.Pointer[tls.Certificate]
	log  *slog.Logger
}

// GetCertificate is tls.Config.GetCertificate.
func (s *Source) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c := s.cert.Load()
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
	if c := s.cert.Load(); c != nil {
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

// FromFiles loads certFile and keyFile and reloads them every interval while
// ctx lives (default interval 10s). It fails when the first load fails.
func FromFiles(ctx context.Context, certFile, keyFile string, interval time.Duration, log *slog.Logger) (*Source, error) {
	if log == nil {
		log = slog.Default()
	}
	if interval <= 0 {
		interval = 10 * time.Second
	}
	s := &Source{log: log}
	load := func() (time.Time, error) {
		ci, err := os.Stat(certFile)
		if err != nil {
			return time.Time{}, fmt.Errorf("stat %s: %w", certFile, err)
		}
		ki, err := os.Stat(keyFile)
		if err != nil {
			return time.Time{}, fmt.Errorf("stat %s: %w", keyFile, err)
		}
		mod := ci.ModTime()
		if ki.ModTime().After(mod) {
			mod = ki.ModTime()
		}
		certPEM, err := os.ReadFile(certFile)
		if err != nil {
			return time.Time{}, fmt.Errorf("read %s: %w", certFile, err)
		}
		keyPEM, err := os.ReadFile(keyFile)
		if err != nil {
			return time.Time{}, fmt.Errorf("read %s: %w", keyFile, err)
		}
		return mod, s.set(certPEM, keyPEM, certFile)
	}
	last, err := load()
	if err != nil {
		return nil, err
	}
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			ci, err1 := os.Stat(certFile)
			ki, err2 := os.Stat(keyFile)
			if err1 != nil || err2 != nil || (!ci.ModTime().After(last) && !ki.ModTime().After(last)) {
				continue
			}
			mod, err := load()
			if err != nil {
				log.Error("reload serving certificate; keeping the previous one", "error", err)
				continue
			}
			last = mod
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
