package manifests

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/embark-mesh/embark/test/testenv"
)

var env *testenv.Env

// The manifests install into istio-system, as in a cluster beside istiod.
func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{}, &env, func(ctx context.Context) error {
		return env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}})
	})
}
