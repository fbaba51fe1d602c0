package multinetwork

import (
	"context"
	"fmt"

	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/embark-mesh/embark/test/testenv"
)

// The topology every test of the package shares.
const (
	// podNetwork is the pods' network: the topology.istio.io/network label
	// of istiod's namespace.
	podNetwork = "kube-network"
	// vmNetwork is the group's network (spec.template.network).
	vmNetwork = "virtual-machines"
	// gatewayAddr is the load-balancer address of vmgateway, the gateway
	// of podNetwork (a TEST-NET-3 address: nothing answers on it).
	gatewayAddr = "203.0.113.10"
	// gatewayPort is istiod's default network gateway port.
	gatewayPort = 15443
	// endpointHost is the onboarding endpoint's DNS name.
	endpointHost = "onboarding-endpoint.example.corp"
)

var (
	env    *testenv.Env
	istiod *testenv.Istiod
)

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{}, &env, func(ctx context.Context) error {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testenv.IstiodNamespace,
			Labels: map[string]string{"topology.istio.io/network": podNetwork}}}
		if err := env.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %s: %w", ns.Name, err)
		}
		if err := createGatewayService(ctx); err != nil {
			return err
		}
		var err error
		istiod, err = testenv.StartIstiod(ctx, env, testenv.IstiodOptions{})
		if err != nil {
			return err
		}
		context.AfterFunc(ctx, func() { _ = istiod.Close() })
		return nil
	})
}

// createGatewayService creates vmgateway as a multi-network install has it:
// a LoadBalancer Service of the east-west gateway's Pods, labelled with the
// pods' network, with its load balancer's address in its status (what a
// cloud's controller writes).
func createGatewayService(ctx context.Context) error {
	port := func(name string, p int32) corev1.ServicePort {
		return corev1.ServicePort{Name: name, Port: p, TargetPort: intstr.FromInt32(p), Protocol: corev1.ProtocolTCP}
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "vmgateway", Namespace: testenv.IstiodNamespace, Labels: map[string]string{
			"topology.istio.io/network": podNetwork, "istio": "eastwestgateway", "app": "istio-eastwestgateway",
		}},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"istio": "eastwestgateway"},
			Ports:    []corev1.ServicePort{port("tls", gatewayPort), port("tls-xds", 15012), port("status-port", 15021)},
		},
	}
	if err := env.Client.Create(ctx, svc); err != nil {
		return fmt.Errorf("create gateway Service: %w", err)
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: gatewayAddr}}
	if err := env.Client.Status().Update(ctx, svc); err != nil {
		return fmt.Errorf("set the gateway Service's load-balancer address: %w", err)
	}
	return nil
}
