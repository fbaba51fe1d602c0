package token_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/embark-mesh/embark/onboarding/token"
)

func TestKeySetFromSecret(t *testing.T) {
	cur, prev := ecKey(t), edKey(t)
	curPEM, prevPEM := pkcs8(t, cur), pkcs8(t, prev)
	curID, prevID := mustKey(t, cur).ID(), mustKey(t, prev).ID()
	tests := []struct {
		name         string
		data         map[string][]byte
		wantErr      string
		wantCurrent  string
		wantPrevious string
	}{
		{name: "current only", data: map[string][]byte{"current.pem": curPEM}, wantCurrent: curID},
		{name: "current and previous", data: map[string][]byte{"current.pem": curPEM, "previous.pem": prevPEM}, wantCurrent: curID, wantPrevious: prevID},
		{name: "empty previous", data: map[string][]byte{"current.pem": curPEM, "previous.pem": []byte("\n")}, wantCurrent: curID},
		{name: "other data keys are ignored", data: map[string][]byte{"current.pem": curPEM, "README": []byte("x")}, wantCurrent: curID},
		{name: "no current", data: map[string][]byte{"previous.pem": prevPEM}, wantErr: "has no current.pem"},
		{name: "empty current", data: map[string][]byte{"current.pem": nil}, wantErr: "has no current.pem"},
		{name: "garbage current", data: map[string][]byte{"current.pem": []byte("garbage")}, wantErr: "key current.pem: no PEM block"},
		{name: "garbage previous", data: map[string][]byte{"current.pem": curPEM, "previous.pem": []byte("garbage")}, wantErr: "key previous.pem: no PEM block"},
		{name: "tls.key style names are not read", data: map[string][]byte{"tls.key": curPEM}, wantErr: "has no current.pem"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "keys"}, Data: tt.data}
			set, err := token.KeySetFromSecret(secret)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "istio-system/keys") {
					t.Fatalf("KeySetFromSecret() error = %v, want one naming the secret and %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var gotPrev string
			if set.Previous() != nil {
				gotPrev = set.Previous().ID()
			}
			if set.Current().ID() != tt.wantCurrent || gotPrev != tt.wantPrevious {
				t.Errorf("key set = %v, want current %s previous %q", set, tt.wantCurrent, tt.wantPrevious)
			}
		})
	}
}

func TestGenerateKeySecret(t *testing.T) {
	secret, set, err := token.GenerateKeySecret("istio-system", "embark-onboarding-token-key")
	if err != nil {
		t.Fatal(err)
	}
	if secret.Namespace != "istio-system" || secret.Name != "embark-onboarding-token-key" || secret.Type != corev1.SecretTypeOpaque {
		t.Errorf("secret meta = %s/%s type %s", secret.Namespace, secret.Name, secret.Type)
	}
	if len(secret.Data) != 1 || !strings.HasPrefix(string(secret.Data[token.SecretKeyCurrent]), "-----BEGIN PRIVATE KEY-----") {
		t.Errorf("secret data = %v, want only a PKCS#8 current.pem", secret.Data)
	}
	parsed, err := token.KeySetFromSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	if parsed.Current().ID() != set.Current().ID() || parsed.Current().Algorithm() != "ES256" || set.Previous() != nil {
		t.Errorf("parsed %v, generated %v", parsed, set)
	}
	other, _, err := token.GenerateKeySecret("istio-system", "x")
	if err != nil {
		t.Fatal(err)
	}
	if string(other.Data[token.SecretKeyCurrent]) == string(secret.Data[token.SecretKeyCurrent]) {
		t.Error("two generated secrets hold the same key")
	}
}
