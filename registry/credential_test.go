package registry

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/embark-mesh/embark/registry/boundtoken"
	"github.com/embark-mesh/embark/test/fixtures"
)

func reviewToken(t *testing.T, token, audience string) authenticationv1.TokenReviewStatus {
	t.Helper()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	r, err := cs.AuthenticationV1().TokenReviews().Create(t.Context(), &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status
}

func TestRegisterCreatesTheSidecarCredential(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	wg := createGroup(t, ns)
	res, err := newRegistrar(t, nil).Write(ctx, Request{Group: wg, Identity: fixtures.AWSIdentity("i-1234567890abcdef0"), Registration: fixtures.Registration("172.31.5.254")})
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: SidecarSecretName(seedName)}, secret); err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(secret); ref == nil || ref.UID != res.Registration.UID || secret.Type != SecretTypeSidecarCredential || secret.Labels[LabelSidecarCredential] != "true" {
		t.Errorf("Secret %s: owner %+v type %s labels %v", secret.Name, ref, secret.Type, secret.Labels)
	}
	tok := res.SidecarToken
	if tok == nil || tok.Token == "" || tok.ServiceAccount.Name != "ratings-vm" {
		t.Fatalf("sidecar token = %+v", tok)
	}
	if d := time.Until(tok.ExpiresAt); d < 55*time.Minute || d > time.Hour+time.Minute {
		t.Errorf("token lifetime %v, want 1h", d)
	}

	// What the real API server says about a Secret-bound token.
	for _, aud := range []string{DefaultXDSAudience, AudienceIstioCA} {
		st := reviewToken(t, tok.Token, aud)
		if !st.Authenticated || st.User.Username != "system:serviceaccount:"+ns+":ratings-vm" {
			t.Errorf("review for %s: %+v", aud, st)
		}
		t.Logf("TokenReview (audience %s) user.extra: %v", aud, st.User.Extra)
	}
	st := reviewToken(t, tok.Token, DefaultXDSAudience)
	claims, err := boundtoken.Decode(tok.Token)
	if err != nil {
		t.Fatal(err)
	}
	if name, uid, ok := claims.SecretRef(); !ok || name != secret.Name || uid != secret.UID {
		t.Errorf("token bound to %s/%s, want Secret %s/%s", name, uid, secret.Name, secret.UID)
	}
	if ids := st.User.Extra["authentication.kubernetes.io/credential-id"]; len(ids) != 1 || ids[0] != "JTI="+claims.ID {
		t.Errorf("credential-id extra = %v, want JTI=%s", ids, claims.ID)
	}
	for k := range st.User.Extra {
		if strings.Contains(k, "secret") {
			t.Errorf("unexpected secret extra %s: update xds/ to use it", k)
		}
	}
	if st := reviewToken(t, tok.Token, "someone-else"); st.Authenticated {
		t.Error("token accepted for another audience")
	}

	// Renewing gives another token bound to the same Secret.
	renewed, err := newRegistrar(t, nil).RenewSidecarToken(ctx, types.NamespacedName{Namespace: ns, Name: seedName})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := boundtoken.Decode(renewed.Token)
	if err != nil {
		t.Fatal(err)
	}
	if _, uid, _ := rc.SecretRef(); uid != secret.UID || rc.ID == claims.ID {
		t.Errorf("renewed token: secret uid %s jti %s", uid, rc.ID)
	}

	// Deleting the registration deletes the Secret and revokes both tokens.
	if err := env.Client.Delete(ctx, res.Registration); err != nil {
		t.Fatal(err)
	}
	fixtures.WaitGone(t, env.Client, secret)
	// The API server caches successful token authentications for 10s
	// (--token-success-cache-ttl... its built-in default): revocation
	// takes effect within that.
	for _, raw := range []string{tok.Token, renewed.Token} {
		err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			return !reviewToken(t, raw, DefaultXDSAudience).Authenticated, nil
		})
		if err != nil {
			t.Errorf("token still valid 30s after the registration was deleted: %v", err)
		}
	}
	_, err = newRegistrar(t, nil).RenewSidecarToken(ctx, types.NamespacedName{Namespace: ns, Name: seedName})
	if !errors.Is(err, ErrRegistrationNotFound) {
		t.Errorf("renew after delete: %v, want ErrRegistrationNotFound", err)
	}
}

func TestMissingServiceAccountFailsBeforeAnyWrite(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	wg := createGroup(t, ns)
	wg.Spec.Template.ServiceAccount = "not-created"
	_, err := newRegistrar(t, nil).Write(ctx, Request{Group: wg, Identity: fixtures.AWSIdentity("i-1234567890abcdef0"), Registration: fixtures.Registration("172.31.5.254")})
	if !errors.Is(err, ErrServiceAccountMissing) || !strings.Contains(err.Error(), ns+"/not-created") {
		t.Fatalf("err = %v, want ErrServiceAccountMissing naming %s/not-created", err, ns)
	}
	assertNoRegistrations(t, ns)
	secrets := &corev1.SecretList{}
	if err := env.Client.List(ctx, secrets, client.InNamespace(ns), client.HasLabels{LabelSidecarCredential}); err != nil || len(secrets.Items) != 0 {
		t.Errorf("sidecar Secrets: %d (%v), want none", len(secrets.Items), err)
	}
	sa := &corev1.ServiceAccount{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "not-created"}, sa); err == nil {
		t.Error("the service account was created")
	}
}

// writeCounter counts API writes by kind of call.
type writeCounter struct {
	mu     sync.Mutex
	writes []string
	tokens int
}

func (w *writeCounter) client() client.Client {
	add := func(s string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.writes = append(w.writes, s)
	}
	return interceptor.NewClient(env.Client, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			err := c.Create(ctx, obj, opts...)
			if err == nil {
				add("create " + typeName(obj))
			}
			return err
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			err := c.Update(ctx, obj, opts...)
			if err == nil {
				add("update " + typeName(obj))
			}
			return err
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			err := c.Patch(ctx, obj, p, opts...)
			if err == nil {
				add("patch " + typeName(obj))
			}
			return err
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			err := c.Delete(ctx, obj, opts...)
			if err == nil {
				add("delete " + typeName(obj))
			}
			return err
		},
		SubResourceCreate: func(ctx context.Context, c client.Client, sub string, obj client.Object, subObj client.Object, opts ...client.SubResourceCreateOption) error {
			w.mu.Lock()
			w.tokens++
			w.mu.Unlock()
			return c.SubResource(sub).Create(ctx, obj, subObj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			err := c.SubResource(sub).Update(ctx, obj, opts...)
			if err == nil {
				add("update " + sub + " " + typeName(obj))
			}
			return err
		},
	})
}

func (w *writeCounter) take() ([]string, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	writes, tokens := w.writes, w.tokens
	w.writes, w.tokens = nil, 0
	return writes, tokens
}

// typeName is obj's kind.
func typeName(obj client.Object) string {
	gvk, err := apiutil.GVKForObject(obj, env.Scheme)
	if err != nil {
		return "unknown"
	}
	return gvk.Kind
}

func TestOnboardingWritesAtMostThreeObjects(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	wg := createGroup(t, ns)
	counter := &writeCounter{}
	r := newRegistrar(t, counter.client())
	req := Request{Group: wg, Identity: fixtures.AWSIdentity("i-1234567890abcdef0"), Registration: fixtures.Registration("172.31.5.254")}
	if _, err := r.Write(ctx, req); err != nil {
		t.Fatal(err)
	}
	writes, tokens := counter.take()
	if len(writes) != 3 || tokens != 1 {
		t.Errorf("first register wrote %v and requested %d tokens, want 3 creates and 1 token", writes, tokens)
	}
	res, err := r.Write(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	writes, tokens = counter.take()
	if len(writes) != 0 || tokens != 1 || res.SidecarToken == nil {
		t.Errorf("register again wrote %v and requested %d tokens, want nothing but 1 token", writes, tokens)
	}
}

// TestIssuedSeesEveryToken: SidecarCredentialOptions.Issued is told each
// token the API server issued, at registration and at renewal, with the
// audiences it was issued for (the xDS server remembers them as reviewed).
func TestIssuedSeesEveryToken(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	wg := createGroup(t, ns)
	type issued struct {
		token     string
		audiences []string
	}
	var seen []issued
	r, err := NewRegistrar(Options{Client: env.Client, Cache: cached, Recorder: recorder, Logger: fixtures.Logger(t),
		Sidecar: SidecarCredentialOptions{Issued: func(token string, audiences []string) { seen = append(seen, issued{token, audiences}) }}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Write(ctx, Request{Group: wg, Identity: fixtures.AWSIdentity("i-1234567890abcdef0"), Registration: fixtures.Registration("172.31.5.254")})
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := r.RenewSidecarToken(ctx, client.ObjectKeyFromObject(res.Registration))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{res.SidecarToken.Token, renewed.Token}
	if len(seen) != 2 || seen[0].token != want[0] || seen[1].token != want[1] {
		t.Fatalf("Issued saw %d tokens, want the registration's and the renewal's", len(seen))
	}
	for _, s := range seen {
		if !slices.Equal(s.audiences, []string{AudienceIstioCA, DefaultXDSAudience}) {
			t.Errorf("Issued told audiences %v, want the token's [%s %s]", s.audiences, AudienceIstioCA, DefaultXDSAudience)
		}
	}
}
