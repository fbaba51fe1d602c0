package rollout

import (
	"os"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/embark-mesh/embark/test/demo/vm"
	"github.com/embark-mesh/embark/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	// The test binary is the simulated VMs' systemctl: the onboarding
	// agent's restart and stop commands run
	// `<test binary> systemctl --socket <socket> restart|stop`.
	if len(os.Args) > 1 && os.Args[1] == vm.SystemctlArg {
		os.Exit(vm.Systemctl(os.Args[2:]))
	}
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	testenv.Main(m, testenv.Options{GarbageCollector: true}, &env)
}
