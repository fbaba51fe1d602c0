// Package scheme builds the runtime.Scheme Embark's clients use: Kubernetes'
// built-in types, Istio's networking and security types and Embark's own APIs.
package scheme

import (
	"fmt"

	istionetworkingv1 "istio.io/client-go/pkg/apis/networking/v1"
	istionetworkingv1alpha3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	istionetworkingv1beta1 "istio.io/client-go/pkg/apis/networking/v1beta1"
	istiosecurityv1 "istio.io/client-go/pkg/apis/security/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	authorizationv1alpha1 "github.com/embark-mesh/embark/api/authorization/v1alpha1"
	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// New returns a new scheme with every type Embark reads or writes.
func New() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme,
		apiextensionsv1.AddToScheme,
		istionetworkingv1.AddToScheme,
		istionetworkingv1beta1.AddToScheme,
		istionetworkingv1alpha3.AddToScheme,
		istiosecurityv1.AddToScheme,
		runtimev1alpha1.AddToScheme,
		authorizationv1alpha1.AddToScheme,
	} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("build scheme: %w", err)
		}
	}
	return s, nil
}
