package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/embark-mesh/embark"

// verifierPackage reports why pkg, a dependency of the agent binary, is
// server-side verification code the agent must not link, or "" if it may.
// The agent builds an AWS credential through awswire and client; it never
// verifies one.
func verifierPackage(pkg string) string {
	switch {
	case strings.Contains(pkg, "pkcs7"):
		return "PKCS#7 verification"
	case pkg == module+"/onboarding/identity/aws/awswire", pkg == module+"/onboarding/identity/aws/client":
		return ""
	case pkg == module+"/onboarding/identity/aws/certs":
		return "the embedded AWS certificates"
	case pkg == module+"/onboarding/identity", strings.HasPrefix(pkg, module+"/onboarding/identity/"):
		return "the onboarding endpoint's identity verifiers"
	case strings.HasPrefix(pkg, module+"/onboarding/endpoint"),
		strings.HasPrefix(pkg, module+"/onboarding/policy"),
		strings.HasPrefix(pkg, module+"/registry"),
		strings.HasPrefix(pkg, module+"/xds"):
		return "server-side code"
	}
	return ""
}

func TestVerifierPackage(t *testing.T) {
	tests := []struct {
		pkg       string
		forbidden bool
	}{
		{pkg: "github.com/smallstep/pkcs7", forbidden: true},
		{pkg: module + "/onboarding/identity", forbidden: true},
		{pkg: module + "/onboarding/identity/aws", forbidden: true},
		{pkg: module + "/onboarding/identity/aws/certs", forbidden: true},
		{pkg: module + "/onboarding/identity/replay", forbidden: true},
		{pkg: module + "/onboarding/endpoint", forbidden: true},
		{pkg: module + "/onboarding/identity/aws/awswire"},
		{pkg: module + "/onboarding/identity/aws/client"},
		{pkg: module + "/onboarding/agent/platform"},
		{pkg: "github.com/aws/aws-sdk-go-v2/service/sts"},
	}
	for _, tt := range tests {
		t.Run(tt.pkg, func(t *testing.T) {
			if got := verifierPackage(tt.pkg) != ""; got != tt.forbidden {
				t.Errorf("verifierPackage(%s) forbidden = %v, want %v", tt.pkg, got, tt.forbidden)
			}
		})
	}
}

// goListDeps returns the import paths of pkg and its dependencies, as
// `go list -deps` lists them.
func goListDeps(t *testing.T, pkg string) []string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is needed to list dependencies: %v", err)
	}
	out, err := exec.CommandContext(t.Context(), goTool, "list", "-deps", "-f", "{{.ImportPath}}", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	deps := strings.Fields(string(out))
	// Both sides hold the AWS credential's wire package: a list without it
	// is not the one this test means.
	if !slices.Contains(deps, module+"/onboarding/identity/aws/awswire") {
		t.Fatalf("go list -deps %s did not list %s/onboarding/identity/aws/awswire; got %d packages", pkg, module, len(deps))
	}
	return deps
}

// TestAgentLinksNoVerifier lists the agent binary's dependencies with
// `go list -deps` and fails on any verifier package.
func TestAgentLinksNoVerifier(t *testing.T) {
	for _, pkg := range goListDeps(t, ".") {
		if why := verifierPackage(pkg); why != "" {
			t.Errorf("the agent binary links %s (%s); build the credential with awswire and keep verification in the endpoint", pkg, why)
		}
	}
}

// TestEndpointLinksNoAgentCode: the onboarding endpoint converts an AWS
// credential with awswire; it does not link the agent's IMDS and STS
// signing client, nor any other agent package.
func TestEndpointLinksNoAgentCode(t *testing.T) {
	for _, pkg := range goListDeps(t, module+"/onboarding/endpoint") {
		if pkg == module+"/onboarding/identity/aws/client" || strings.HasPrefix(pkg, module+"/onboarding/agent") {
			t.Errorf("the onboarding endpoint links agent-side package %s", pkg)
		}
	}
}
