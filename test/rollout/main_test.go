package rollout

import (
	"fmt"
	"os"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/embark-mesh/embark/test/testenv"
	"github.com/embark-mesh/embark/test/vmsim"
)

var env *testenv.Env

// systemctlArg makes the test binary the simulated VMs' systemctl: the
// onboarding agent's restart and stop commands run
// `<test binary> systemctl <socket> restart|stop`.
const systemctlArg = "systemctl"

func TestMain(m *testing.M) {
	if len(os.Args) == 4 && os.Args[1] == systemctlArg {
		if err := vmsim.Systemctl(os.Args[2], os.Args[3]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	testenv.Main(m, testenv.Options{GarbageCollector: true}, &env)
}
