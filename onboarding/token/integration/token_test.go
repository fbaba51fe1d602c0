package integration_test

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/embark-mesh/embark/onboarding/token"
	"github.com/embark-mesh/embark/test/fixtures"
	"github.com/embark-mesh/embark/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, testenv.Options{}, &env) }

// SecretKeySource runs under a controller-runtime manager on every replica.
var (
	_ manager.Runnable               = (*token.SecretKeySource)(nil)
	_ manager.LeaderElectionRunnable = (*token.SecretKeySource)(nil)
)

const (
	secretName = "onboarding-token-signing-key"
	issuerURL  = "https://onboarding.example.com:15443"
	audience   = "embark.io/onboarding/cluster-1"
	timeout    = time.Minute
)

func secrets(t *testing.T) typedcorev1.SecretsGetter {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return cs.CoreV1()
}

func request(ns string) token.Request {
	return token.Request{
		Namespace:        ns,
		Name:             "ratings-aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0",
		WorkloadGroup:    "ratings",
		WorkloadIdentity: "aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0",
	}
}

// startSource runs a SecretKeySource for ns/secretName until the test ends
// and waits for its first key set.
func startSource(t *testing.T, ns string, waitForKeys bool) *token.SecretKeySource {
	t.Helper()
	src := token.NewSecretKeySource(secrets(t), ns, secretName, token.WithSourceLogger(fixtures.DebugLogger(t)))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- src.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})
	if waitForKeys {
		waitCtx, cancelWait := context.WithTimeout(t.Context(), timeout)
		defer cancelWait()
		if err := src.WaitForKeys(waitCtx); err != nil {
			t.Fatal(err)
		}
	}
	return src
}

func newIssuer(t *testing.T, src token.KeySource) *token.Issuer {
	t.Helper()
	iss, err := token.NewIssuer(src, issuerURL, audience, token.WithLogger(fixtures.DebugLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

func issue(t *testing.T, iss *token.Issuer, ns string) (string, *token.Claims) {
	t.Helper()
	tok, c, err := iss.Issue(request(ns))
	if err != nil {
		t.Fatalf("Issue: %v", err)
	}
	return tok, c
}

// waitForKeyID polls until iss signs with the key kid.
func waitForKeyID(t *testing.T, iss *token.Issuer, ns, kid string) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		_, c, err := iss.Issue(request(ns))
		if err != nil {
			return false, err
		}
		last = c.KeyID
		return c.KeyID == kid, nil
	})
	if err != nil {
		t.Fatalf("issuer still signs with %s, want %s: %v", last, kid, err)
	}
}

func getSecret(t *testing.T, ns string) *corev1.Secret {
	t.Helper()
	s, err := secrets(t).Secrets(ns).Get(t.Context(), secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func keyIDs(t *testing.T, s *corev1.Secret) (current, previous string) {
	t.Helper()
	set, err := token.KeySetFromSecret(s)
	if err != nil {
		t.Fatal(err)
	}
	if set.Previous() != nil {
		previous = set.Previous().ID()
	}
	return set.Current().ID(), previous
}

// interfering wraps a SecretsGetter and lets a test act between a caller's
// read and its write, so that the API server sees a real race.
type interfering struct {
	typedcorev1.SecretsGetter
	beforeCreate func(ctx context.Context) error
	beforeUpdate func(ctx context.Context) error
	updates      atomic.Int32
	// alreadyExists counts creates the API server refused as AlreadyExists.
	alreadyExists atomic.Int32
}

func (g *interfering) Secrets(ns string) typedcorev1.SecretInterface {
	return &interferingSecrets{SecretInterface: g.SecretsGetter.Secrets(ns), g: g}
}

type interferingSecrets struct {
	typedcorev1.SecretInterface
	g *interfering
}

func (s *interferingSecrets) Create(ctx context.Context, secret *corev1.Secret, opts metav1.CreateOptions) (*corev1.Secret, error) {
	if s.g.beforeCreate != nil {
		if err := s.g.beforeCreate(ctx); err != nil {
			return nil, err
		}
	}
	created, err := s.SecretInterface.Create(ctx, secret, opts)
	if apierrors.IsAlreadyExists(err) {
		s.g.alreadyExists.Add(1)
	}
	return created, err
}

func (s *interferingSecrets) Update(ctx context.Context, secret *corev1.Secret, opts metav1.UpdateOptions) (*corev1.Secret, error) {
	if s.g.updates.Add(1) == 1 && s.g.beforeUpdate != nil {
		if err := s.g.beforeUpdate(ctx); err != nil {
			return nil, err
		}
	}
	return s.SecretInterface.Update(ctx, secret, opts)
}

func TestEnsureKeySecretConcurrentCallers(t *testing.T) {
	tests := []struct {
		name string
		// meetAtCreate holds both callers until both are about to create
		// the Secret, so that one of them must get AlreadyExists.
		meetAtCreate bool
	}{
		{name: "both callers race to create", meetAtCreate: true},
		{name: "concurrent callers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := env.Namespace(t)
			g := &interfering{SecretsGetter: secrets(t)}
			if tt.meetAtCreate {
				var arrived sync.WaitGroup
				arrived.Add(2)
				all := make(chan struct{})
				go func() { arrived.Wait(); close(all) }()
				g.beforeCreate = func(ctx context.Context) error {
					arrived.Done()
					select {
					case <-all:
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				}
			}
			var (
				wg   sync.WaitGroup
				sets [2]*token.KeySet
				errs [2]error
			)
			for i := range 2 {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(t.Context(), timeout)
					defer cancel()
					sets[i], errs[i] = token.EnsureKeySecret(ctx, g, ns, secretName)
				})
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("caller %d: %v", i, err)
				}
			}
			if sets[0].Current().ID() != sets[1].Current().ID() {
				t.Fatalf("callers got different keys: %s and %s", sets[0].Current().ID(), sets[1].Current().ID())
			}
			if tt.meetAtCreate && g.alreadyExists.Load() != 1 {
				t.Errorf("%d creates got AlreadyExists, want 1", g.alreadyExists.Load())
			}
			stored := getSecret(t, ns)
			if cur, prev := keyIDs(t, stored); cur != sets[0].Current().ID() || prev != "" {
				t.Errorf("secret holds current %s previous %q, callers got %s", cur, prev, sets[0].Current().ID())
			}
			if stored.Labels["app.kubernetes.io/component"] != "onboarding-token-signing-key" {
				t.Errorf("secret labels = %v", stored.Labels)
			}

			// Idempotent: a later call changes nothing.
			again, err := token.EnsureKeySecret(t.Context(), secrets(t), ns, secretName)
			if err != nil {
				t.Fatal(err)
			}
			if again.Current().ID() != sets[0].Current().ID() {
				t.Errorf("third call got %s, want %s", again.Current().ID(), sets[0].Current().ID())
			}
			if rv := getSecret(t, ns).ResourceVersion; rv != stored.ResourceVersion {
				t.Errorf("third call wrote the secret: resourceVersion %s -> %s", stored.ResourceVersion, rv)
			}
		})
	}
}

func TestEnsureKeySecretKeepsAnInvalidSecret(t *testing.T) {
	ns := env.Namespace(t)
	bad := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: secretName},
		Data:       map[string][]byte{token.SecretKeyCurrent: []byte("garbage")},
	}
	if _, err := secrets(t).Secrets(ns).Create(t.Context(), bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := token.EnsureKeySecret(t.Context(), secrets(t), ns, secretName); err == nil || !strings.Contains(err.Error(), "current.pem") {
		t.Fatalf("EnsureKeySecret() error = %v, want one about current.pem", err)
	}
	if got := string(getSecret(t, ns).Data[token.SecretKeyCurrent]); got != "garbage" {
		t.Errorf("EnsureKeySecret overwrote the secret: current.pem = %q", got)
	}
}

// A token signed before a rotation through the API server keeps verifying
// (as the previous key) and stops after the second rotation.
func TestSecretKeySourceFollowsRotation(t *testing.T) {
	ns := env.Namespace(t)
	k0, err := token.EnsureKeySecret(t.Context(), secrets(t), ns, secretName)
	if err != nil {
		t.Fatal(err)
	}
	src := startSource(t, ns, true)
	iss := newIssuer(t, src)
	t0, c0 := issue(t, iss, ns)
	if c0.KeyID != k0.Current().ID() {
		t.Fatalf("signed with %s, want %s", c0.KeyID, k0.Current().ID())
	}

	k1, err := token.Rotate(t.Context(), secrets(t), ns, secretName)
	if err != nil {
		t.Fatal(err)
	}
	if k1.Previous() == nil || k1.Previous().ID() != k0.Current().ID() || k1.Current().ID() == k0.Current().ID() {
		t.Fatalf("Rotate returned %v after %v", k1, k0)
	}
	waitForKeyID(t, iss, ns, k1.Current().ID())
	t1, _ := issue(t, iss, ns)

	tests := []struct {
		name      string
		token     string
		wantKeyID string
	}{
		{name: "token of the previous key", token: t0, wantKeyID: k0.Current().ID()},
		{name: "token of the current key", token: t1, wantKeyID: k1.Current().ID()},
	}
	for _, tt := range tests {
		t.Run("after one rotation/"+tt.name, func(t *testing.T) {
			c, err := iss.Verify(tt.token)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if c.KeyID != tt.wantKeyID {
				t.Errorf("KeyID = %s, want %s", c.KeyID, tt.wantKeyID)
			}
		})
	}

	k2, err := token.Rotate(t.Context(), secrets(t), ns, secretName)
	if err != nil {
		t.Fatal(err)
	}
	waitForKeyID(t, iss, ns, k2.Current().ID())
	if _, err := iss.Verify(t0); !errors.Is(err, token.ReasonUnknownKey) {
		t.Errorf("token of the key rotated out: Verify() error = %v, want UnknownKey", err)
	}
	if c, err := iss.Verify(t1); err != nil || c.KeyID != k1.Current().ID() {
		t.Errorf("token of the previous key: Verify() = %v, %v", c, err)
	}
	if stats := src.Stats(); stats.Loads < 3 || stats.Errors != 0 {
		t.Errorf("Stats() = %+v, want at least 3 loads and no errors", stats)
	}
}

// A source started before the Secret exists issues nothing, then picks the
// Secret up when it is created.
func TestSecretKeySourceWaitsForTheSecret(t *testing.T) {
	ns := env.Namespace(t)
	src := startSource(t, ns, false)
	iss := newIssuer(t, src)
	if set := src.KeySet(); set != nil {
		t.Fatalf("keys %v loaded before the secret exists", set)
	}
	if _, _, err := iss.Issue(request(ns)); !errors.Is(err, token.ErrNoSigningKey) {
		t.Fatalf("Issue() before the secret exists: %v, want ErrNoSigningKey", err)
	}
	set, err := token.EnsureKeySecret(t.Context(), secrets(t), ns, secretName)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	if err := src.WaitForKeys(ctx); err != nil {
		t.Fatal(err)
	}
	if _, c := issue(t, iss, ns); c.KeyID != set.Current().ID() {
		t.Errorf("signed with %s, want %s", c.KeyID, set.Current().ID())
	}
}

// A Secret that goes bad (or away) leaves the last good keys in place; a
// later good version is picked up again.
func TestSecretKeySourceKeepsKeysWhenTheSecretGoesBad(t *testing.T) {
	tests := []struct {
		name    string
		breakIt func(t *testing.T, ns string, s *corev1.Secret)
		// wantRecovery: writing a good version afterwards is picked up.
		wantRecovery bool
	}{
		{name: "garbage current key", wantRecovery: true, breakIt: func(t *testing.T, ns string, s *corev1.Secret) {
			s.Data[token.SecretKeyCurrent] = []byte("-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n")
			update(t, ns, s)
		}},
		{name: "garbage previous key", wantRecovery: true, breakIt: func(t *testing.T, ns string, s *corev1.Secret) {
			s.Data[token.SecretKeyPrevious] = []byte("garbage")
			update(t, ns, s)
		}},
		{name: "current key removed", wantRecovery: true, breakIt: func(t *testing.T, ns string, s *corev1.Secret) {
			delete(s.Data, token.SecretKeyCurrent)
			update(t, ns, s)
		}},
		{name: "unsupported key type", wantRecovery: true, breakIt: func(t *testing.T, ns string, s *corev1.Secret) {
			s.Data[token.SecretKeyCurrent] = p384PEM(t)
			update(t, ns, s)
		}},
		{name: "secret deleted", breakIt: func(t *testing.T, ns string, s *corev1.Secret) {
			if err := secrets(t).Secrets(ns).Delete(t.Context(), s.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := env.Namespace(t)
			k0, err := token.EnsureKeySecret(t.Context(), secrets(t), ns, secretName)
			if err != nil {
				t.Fatal(err)
			}
			src := startSource(t, ns, true)
			iss := newIssuer(t, src)
			t0, _ := issue(t, iss, ns)

			tt.breakIt(t, ns, getSecretOrNil(t, ns))
			err = wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
				return src.Stats().Errors >= 1, nil
			})
			if err != nil {
				t.Fatalf("the source did not notice the change: %+v: %v", src.Stats(), err)
			}
			if c, err := iss.Verify(t0); err != nil || c.KeyID != k0.Current().ID() {
				t.Errorf("token issued before: Verify() = %v, %v", c, err)
			}
			if _, c := issue(t, iss, ns); c.KeyID != k0.Current().ID() {
				t.Errorf("signed with %s after the secret went bad, want the kept key %s", c.KeyID, k0.Current().ID())
			}
			if !tt.wantRecovery {
				return
			}

			// Repair it with a fresh key: the source follows again.
			fixed, set, err := token.GenerateKeySecret(ns, secretName)
			if err != nil {
				t.Fatal(err)
			}
			s := getSecret(t, ns)
			s.Data = fixed.Data
			update(t, ns, s)
			waitForKeyID(t, iss, ns, set.Current().ID())
		})
	}
}

func getSecretOrNil(t *testing.T, ns string) *corev1.Secret {
	t.Helper()
	s := getSecret(t, ns)
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	return s
}

func update(t *testing.T, ns string, s *corev1.Secret) {
	t.Helper()
	if _, err := secrets(t).Secrets(ns).Update(t.Context(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestRotate(t *testing.T) {
	tests := []struct {
		name string
		// interfere runs between Rotate's read and its first write; it
		// returns the current key ID it left in the Secret, if it changed it.
		interfere func(ctx context.Context, t *testing.T, ns string) (string, error)
		// wantUpdates is how many updates Rotate sent.
		wantUpdates int32
		// wantCurrentFromInterference: Rotate found the key already rotated
		// by someone else and returned that rotation instead of rotating again.
		wantCurrentFromInterference bool
		wantLabel                   string
	}{
		{name: "no conflict", wantUpdates: 1},
		{
			name: "conflict with an unrelated write is retried",
			interfere: func(ctx context.Context, t *testing.T, ns string) (string, error) {
				s := getSecret(t, ns)
				s.Labels["touched"] = "yes"
				_, err := secrets(t).Secrets(ns).Update(ctx, s, metav1.UpdateOptions{})
				return "", err
			},
			wantUpdates: 2,
			wantLabel:   "yes",
		},
		{
			name: "conflict with a concurrent rotation does not rotate twice",
			interfere: func(ctx context.Context, t *testing.T, ns string) (string, error) {
				set, err := token.Rotate(ctx, secrets(t), ns, secretName)
				if err != nil {
					return "", err
				}
				return set.Current().ID(), nil
			},
			wantUpdates:                 1,
			wantCurrentFromInterference: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := env.Namespace(t)
			k0, err := token.EnsureKeySecret(t.Context(), secrets(t), ns, secretName)
			if err != nil {
				t.Fatal(err)
			}
			g := &interfering{SecretsGetter: secrets(t)}
			var otherCurrent string
			if tt.interfere != nil {
				g.beforeUpdate = func(ctx context.Context) (err error) {
					otherCurrent, err = tt.interfere(ctx, t, ns)
					return err
				}
			}
			got, err := token.Rotate(t.Context(), g, ns, secretName)
			if err != nil {
				t.Fatalf("Rotate: %v", err)
			}
			if n := g.updates.Load(); n != tt.wantUpdates {
				t.Errorf("Rotate sent %d updates, want %d", n, tt.wantUpdates)
			}
			stored := getSecret(t, ns)
			cur, prev := keyIDs(t, stored)
			// A second rotation would have dropped k0, whose tokens are
			// still valid.
			if prev != k0.Current().ID() {
				t.Errorf("previous key = %s, want the key before the rotation %s", prev, k0.Current().ID())
			}
			if cur != got.Current().ID() || got.Previous() == nil || got.Previous().ID() != prev {
				t.Errorf("Rotate returned %v, the secret holds current %s previous %s", got, cur, prev)
			}
			if cur == k0.Current().ID() {
				t.Error("current key unchanged")
			}
			if tt.wantCurrentFromInterference && cur != otherCurrent {
				t.Errorf("current key = %s, want the concurrent rotation's %s", cur, otherCurrent)
			}
			if tt.wantLabel != "" && stored.Labels["touched"] != tt.wantLabel {
				t.Errorf("the concurrent write was lost: labels %v", stored.Labels)
			}
		})
	}
}

func TestRotateRefuses(t *testing.T) {
	tests := []struct {
		name         string
		data         map[string][]byte // nil: no secret
		wantErr      string
		wantNotFound bool
	}{
		{name: "missing secret", wantErr: "not found", wantNotFound: true},
		{name: "invalid current key", data: map[string][]byte{token.SecretKeyCurrent: []byte("garbage")}, wantErr: "refusing to rotate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := env.Namespace(t)
			if tt.data != nil {
				s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: secretName}, Data: tt.data}
				if _, err := secrets(t).Secrets(ns).Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			_, err := token.Rotate(t.Context(), secrets(t), ns, secretName)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Rotate() error = %v, want %q", err, tt.wantErr)
			}
			if apierrors.IsNotFound(err) != tt.wantNotFound {
				t.Errorf("apierrors.IsNotFound(%v) = %v, want %v", err, !tt.wantNotFound, tt.wantNotFound)
			}
			if tt.data != nil && string(getSecret(t, ns).Data[token.SecretKeyCurrent]) != string(tt.data[token.SecretKeyCurrent]) {
				t.Error("Rotate changed a secret it refused")
			}
		})
	}
}

// The manual rotation procedure of docs/onboarding-token.md, with kubectl,
// is picked up by a running source.
func TestDocumentedKubectlRotation(t *testing.T) {
	ns := env.Namespace(t)
	k0, err := token.EnsureKeySecret(t.Context(), secrets(t), ns, secretName)
	if err != nil {
		t.Fatal(err)
	}
	src := startSource(t, ns, true)
	iss := newIssuer(t, src)
	t0, _ := issue(t, iss, ns)
	dir := t.TempDir()

	// kubectl -n NS get secret NAME -o jsonpath='{.data.current\.pem}' | base64 -d > old.pem
	out, err := env.Kubectl(t.Context(), nil, "-n", ns, "get", "secret", secretName, "-o", `jsonpath={.data.current\.pem}`)
	if err != nil {
		t.Fatal(err)
	}
	oldPEM, err := base64.StdEncoding.DecodeString(out)
	if err != nil {
		t.Fatalf("decode kubectl output %q: %v", out, err)
	}
	// openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out new.pem
	// (the same PKCS#8 "PRIVATE KEY" PEM as MarshalPEM writes).
	newKey, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	newPEM, err := newKey.MarshalPEM()
	if err != nil {
		t.Fatal(err)
	}
	oldFile, newFile := filepath.Join(dir, "old.pem"), filepath.Join(dir, "new.pem")
	for f, data := range map[string][]byte{oldFile: oldPEM, newFile: newPEM} {
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// kubectl -n NS create secret generic NAME --from-file=current.pem=new.pem
	//   --from-file=previous.pem=old.pem --dry-run=client -o yaml | kubectl replace -f -
	manifest, err := env.Kubectl(t.Context(), nil, "-n", ns, "create", "secret", "generic", secretName,
		"--from-file=current.pem="+newFile, "--from-file=previous.pem="+oldFile, "--dry-run=client", "-o", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Kubectl(t.Context(), []byte(manifest), "replace", "-f", "-"); err != nil {
		t.Fatal(err)
	}

	waitForKeyID(t, iss, ns, newKey.ID())
	if c, err := iss.Verify(t0); err != nil || c.KeyID != k0.Current().ID() {
		t.Errorf("token of the previous key: Verify() = %v, %v", c, err)
	}
}
