package rollout

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/embark-mesh/embark/test/testenv"
)

var env *testenv.Env

// systemctlArg makes the test binary the simulated VMs' systemctl: the
// onboarding agent's restart and stop commands run
// `<test binary> systemctl <socket> restart|stop`.
const systemctlArg = "systemctl"

func TestMain(m *testing.M) {
	if len(os.Args) == 4 && os.Args[1] == systemctlArg {
		os.Exit(systemctl(os.Args[2], os.Args[3]))
	}
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	testenv.Main(m, testenv.Options{GarbageCollector: true}, &env)
}

// systemctl asks the unit listening on socket to run verb and waits for
// its answer, as `systemctl restart istio-sidecar` waits for the unit.
func systemctl(socket, verb string) int {
	c, err := net.DialTimeout("unix", socket, 5*time.Second)
	if err != nil {
		fmt.Fprintf(os.Stderr, "systemctl: %v\n", err)
		return 1
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	if _, err := fmt.Fprintln(c, verb); err != nil {
		fmt.Fprintf(os.Stderr, "systemctl: %v\n", err)
		return 1
	}
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		fmt.Fprintf(os.Stderr, "systemctl %s: no reply: %v\n", verb, err)
		return 1
	}
	if reply = strings.TrimSpace(reply); reply != "ok" {
		fmt.Fprintf(os.Stderr, "systemctl %s: %s\n", verb, reply)
		return 1
	}
	return 0
}
