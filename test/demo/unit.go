package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/embark-mesh/embark/test/vmsim"
)

// systemctlArg is the first argument that runs the demo binary as the
// simulated VM's systemctl.
const systemctlArg = "systemctl"

// systemctl is the demo binary run as `demo systemctl --socket S VERB`: it
// asks the VM's sidecar unit to run VERB and exits non-zero when it failed.
func systemctl(args []string) int {
	if len(args) != 3 || args[0] != "--socket" {
		fmt.Fprintln(os.Stderr, "usage: demo systemctl --socket SOCKET restart|stop")
		return 2
	}
	if err := vmsim.Systemctl(args[1], args[2]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// parseClusterEnv reads cluster.env as systemd's EnvironmentFile= does for
// the lines the onboarding agent writes: comments, blank lines and
// KEY='value' with '\” for a quote (or an unquoted value).
func parseClusterEnv(data []byte) (map[string]string, error) {
	env := map[string]string{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t'\"") {
			return nil, fmt.Errorf("cluster.env line %d: want KEY=value, got %q", i+1, line)
		}
		if strings.HasPrefix(v, "'") {
			var b strings.Builder
			rest := v
			for {
				if !strings.HasPrefix(rest, "'") {
					return nil, fmt.Errorf("cluster.env line %d: bad quoting in %q", i+1, v)
				}
				end := strings.IndexByte(rest[1:], '\'')
				if end < 0 {
					return nil, fmt.Errorf("cluster.env line %d: unterminated quote in %q", i+1, v)
				}
				b.WriteString(rest[1 : 1+end])
				rest = rest[2+end:]
				if rest == "" {
					break
				}
				if !strings.HasPrefix(rest, `\'`) {
					return nil, fmt.Errorf("cluster.env line %d: bad quoting in %q", i+1, v)
				}
				b.WriteByte('\'')
				rest = rest[2:]
			}
			v = b.String()
		}
		env[k] = v
	}
	return env, nil
}
