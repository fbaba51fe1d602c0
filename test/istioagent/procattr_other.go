//go:build !linux

package istioagent

import "os/exec"

// setProcAttr does nothing where the kernel cannot tie the child's life to ours.
func setProcAttr(*exec.Cmd) {}
