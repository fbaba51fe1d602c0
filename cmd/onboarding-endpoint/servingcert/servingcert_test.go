package servingcert

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/embark-mesh/embark/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}, &env) }

func selfSigned(t *testing.T, serial int64) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "onboarding-endpoint.example"},
		DNSNames: []string{"onboarding-endpoint.example"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd})
}

func serialOf(t *testing.T, s *Source) int64 {
	t.Helper()
	c, err := s.GetCertificate(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatal(err)
	}
	return c.Leaf.SerialNumber.Int64()
}

func waitSerial(t *testing.T, s *Source, want int64) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return serialOf(t, s) == want, nil
	})
	if err != nil {
		t.Fatalf("serial stayed %d, want %d", serialOf(t, s), want)
	}
}

func TestFromSecretFollowsUpdatesAndKeepsTheLastGood(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	cs := kubernetes.NewForConfigOrDie(env.Config)
	cert, key := selfSigned(t, 1)
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "onboarding-endpoint-tls-cert", Namespace: ns},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: cert, corev1.TLSPrivateKeyKey: key},
	}
	sec, err := cs.CoreV1().Secrets(ns).Create(ctx, sec, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := FromSecret(ctx, cs, ns, sec.Name, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if got := serialOf(t, s); got != 1 {
		t.Fatalf("serial = %d, want 1", got)
	}

	// cert-manager renews the certificate.
	sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey] = selfSigned(t, 2)
	if sec, err = cs.CoreV1().Secrets(ns).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSerial(t, s, 2)

	// A broken update (key of another certificate) keeps serving the last good one.
	_, otherKey := selfSigned(t, 3)
	sec.Data[corev1.TLSPrivateKeyKey] = otherKey
	if sec, err = cs.CoreV1().Secrets(ns).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Then a good one: seeing it proves the broken one was processed first.
	sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey] = selfSigned(t, 4)
	if _, err = cs.CoreV1().Secrets(ns).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSerial(t, s, 4)
}

func TestFromSecretWaitsForTheSecret(t *testing.T) {
	ns := env.Namespace(t)
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_, err := FromSecret(ctx, kubernetes.NewForConfigOrDie(env.Config), ns, "missing", slog.New(slog.DiscardHandler))
	if err == nil {
		t.Fatal("want an error when the Secret never appears")
	}
}

func TestFromFilesReloads(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	write := func(serial int64, at time.Time) {
		c, k := selfSigned(t, serial)
		for f, data := range map[string][]byte{certFile: c, keyFile: k} {
			if err := os.WriteFile(f, data, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(f, at, at); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(1, time.Now().Add(-time.Minute))
	s, err := FromFiles(t.Context(), certFile, keyFile, 10*time.Millisecond, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if got := serialOf(t, s); got != 1 {
		t.Fatalf("serial = %d", got)
	}
	write(2, time.Now())
	waitSerial(t, s, 2)

	if _, err := FromFiles(t.Context(), filepath.Join(dir, "none"), keyFile, 0, nil); err == nil {
		t.Error("a missing certificate file must fail start-up")
	}
}
