package istioagent

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel kill pilot-agent when the test process dies, so
// an interrupted test leaves no agent behind.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
