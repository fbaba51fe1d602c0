package multinetwork

import (
	"context"
	"testing"

	"github.com/embark-mesh/embark/test/meshnet"
	"github.com/embark-mesh/embark/test/testenv"
)

// The topology every test of the package shares (meshnet's networks).
const (
	podNetwork = meshnet.PodNetwork
	vmNetwork  = meshnet.VMNetwork
	// gatewayAddr is the load-balancer address of vmgateway, the gateway
	// of podNetwork (a TEST-NET-3 address: nothing answers on it).
	gatewayAddr = "203.0.113.10"
	gatewayPort = meshnet.GatewayPort
	// endpointHost is the onboarding endpoint's DNS name.
	endpointHost = "onboarding-endpoint.example.corp"
)

var (
	env    *testenv.Env
	istiod *testenv.Istiod
)

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{}, &env, func(ctx context.Context) error {
		if err := meshnet.LabelNamespace(ctx, env.Client, testenv.IstiodNamespace, podNetwork); err != nil {
			return err
		}
		if err := meshnet.CreateGatewayService(ctx, env.Client, testenv.IstiodNamespace, podNetwork, gatewayAddr); err != nil {
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
