package endpoint

import (
	"os/exec"
	"strings"
	"testing"
)

// TestEndpointLinksNoAgentCode lists the endpoint package's dependencies
// with `go list -deps` and fails on agent-side code: the endpoint converts
// an AWS credential with awswire, it does not need the agent's IMDS and STS
// signing client.
func TestEndpointLinksNoAgentCode(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is needed to list the endpoint's dependencies: %v", err)
	}
	out, err := exec.CommandContext(t.Context(), goTool, "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	const module = "github.com/embark-mesh/embark"
	var found bool
	for _, pkg := range strings.Fields(string(out)) {
		switch {
		case pkg == module+"/onboarding/identity/aws/awswire":
			found = true
		case pkg == module+"/onboarding/identity/aws/client", strings.HasPrefix(pkg, module+"/onboarding/agent"):
			t.Errorf("the onboarding endpoint links agent-side package %s", pkg)
		}
	}
	if !found {
		t.Errorf("the onboarding endpoint does not link %s/onboarding/identity/aws/awswire; is this the endpoint's dependency list?", module)
	}
}
