package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"k8s.io/client-go/kubernetes"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
	"github.com/embark-mesh/embark/test/demo/check"
	"github.com/embark-mesh/embark/test/demo/vm"
	"github.com/embark-mesh/embark/test/fixtures"
)

// The on-prem host: it proves itself with a JWT of an OIDC issuer, here the
// demo kube-apiserver's own service-account issuer standing in for a
// corporate one (docs/identity.md, "On-prem set-up"). Its tokens are those
// of the service account named like the host in namespace onprem.
const (
	onPremNamespace = "onprem"
	onPremHost      = "vm-01.example.com"
	onPremShortName = "kube"
	// onPremIP is the host's address (the policy allows it: a JWT proves no
	// address), a loopback address of its own where its application listens.
	onPremIP = "127.0.1.50"
)

// issuerURL reads the demo kube-apiserver's service-account issuer from its
// OIDC discovery document.
func (d *demo) issuerURL(ctx context.Context) (string, error) {
	cs, err := kubernetes.NewForConfig(d.env.Config)
	if err != nil {
		return "", err
	}
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/.well-known/openid-configuration").DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("read the service-account issuer's discovery document: %w", err)
	}
	var doc struct {
		Issuer string `json:"issuer"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil || doc.Issuer == "" {
		return "", fmt.Errorf("the discovery document names no issuer (%v): %s", err, raw)
	}
	return doc.Issuer, nil
}

// withOnPremIssuer adds the on-prem issuer to the identity section of the
// endpoint's configuration: its keys are found by OIDC discovery, its TLS
// is trusted through the apiserver's CA, and its subjectPrefix turns
// system:serviceaccount:onprem:vm-01.example.com into vm-01.example.com.
func (d *demo) withOnPremIssuer(ctx context.Context, cfg string) (string, error) {
	issuer, err := d.issuerURL(ctx)
	if err != nil {
		return "", err
	}
	caFile := filepath.Join(d.work, "issuer-ca.pem")
	if err := os.WriteFile(caFile, d.env.Config.CAData, 0o600); err != nil {
		return "", err
	}
	const section = "\nidentity:\n"
	if !strings.Contains(cfg, section) {
		return "", errors.New("the endpoint configuration has no identity section")
	}
	return strings.Replace(cfg, section, section+fmt.Sprintf(`  jwt:
  - issuer: %q
    shortName: %s
    subjectPrefix: "system:serviceaccount:%s:"
    caFile: %s
    maxTokenLifetime: 15m
`, issuer, onPremShortName, onPremNamespace, caFile), 1), nil
}

// onPremRegistrationName is the name docs/identity.md promises, computed
// from the documented rule, not by Embark's code: <group>-jwt-<shortName>-
// <subject>-<first 16 hex digits of SHA-256(issuer NUL subject)>.
func onPremRegistrationName(group, issuer, subject string) string {
	sum := sha256.Sum256([]byte(issuer + "\x00" + subject))
	return group + "-jwt-" + onPremShortName + "-" + subject + "-" + hex.EncodeToString(sum[:])[:16]
}

// onPremOnboarding onboards an on-prem host next to the EC2 instances: the
// issuer's discovery made public, a service account for the host, a policy
// allowing its subject, and the host's onboarding agent with a credential
// plugin (kubectl create token) minting a fresh token for every onboarding.
// The host joins d.vms, so the demo's clean-up shuts it down.
func (d *demo) onPremOnboarding(ctx context.Context, out io.Writer) error {
	issuer, err := d.issuerURL(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "issuer %s (the demo kube-apiserver's service-account issuer), configured on the endpoint as %q with subjectPrefix system:serviceaccount:%s:\n", issuer, onPremShortName, onPremNamespace)
	for _, args := range [][]string{
		{"create", "clusterrolebinding", "oidc-reviewer", "--clusterrole=system:service-account-issuer-discovery", "--group=system:unauthenticated"},
		{"create", "namespace", onPremNamespace},
		{"create", "serviceaccount", onPremHost, "-n", onPremNamespace},
	} {
		if err := d.kubectl(ctx, out, args...); err != nil {
			return err
		}
	}
	if err := d.showChecked(ctx, out, func(s string) error { return check.Contains(s, `"issuer":"`+issuer+`"`, "jwks_uri") },
		"get", "--raw", "/.well-known/openid-configuration"); err != nil {
		return err
	}
	fmt.Fprintln(out)
	policy := filepath.Join(d.work, "onprem-policy.yaml")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`apiVersion: authorization.onboarding.tetrate.io/v1alpha1
kind: OnboardingPolicy
metadata:
  name: on-prem
  namespace: bookinfo
spec:
  allow:
  - workloads:
    - jwt:
        issuer: %s
        subjects: [%s]
    addressCIDRs: [%s/32]
    onboardTo:
    - workloadGroupSelector: {}
`, issuer, onPremHost, onPremIP)), 0o600); err != nil {
		return err
	}
	if err := d.kubectl(ctx, out, "apply", "-f", policy); err != nil {
		return err
	}

	v := &vm.VM{Name: onPremHost, Root: filepath.Join(d.work, "vms", onPremHost)}
	d.vms = append(d.vms, v)
	if err := d.startOnPremAgent(v, issuer); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nonboarding-agent started on %s (host.platform jwt, host.jwt.command: kubectl create token %s -n %s --audience %s --duration 10m)\n",
		onPremHost, onPremHost, onPremNamespace, endpointHost)
	want := onPremRegistrationName("ratings", issuer, onPremHost)
	if err := fixtures.Poll(ctx, pollInterval, waitFor, func() error {
		if name, restarts := v.State(); restarts == 0 {
			return fmt.Errorf("the onboarding agent has not started the sidecar yet; its log:\n%s", v.AgentLog("level="))
		} else if name != want {
			return fmt.Errorf("the host registered as %s, docs/identity.md promises %s", name, want)
		}
		return d.checkConnected(ctx, v, "True")
	}); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s\n", v.AgentLog("onboarded", "sidecar (re)started"))
	fmt.Fprintf(out, "registration name as docs/identity.md promises: ratings-jwt-%s-%s-<first 16 hex digits of sha256(issuer NUL subject)> = %s\n\n", onPremShortName, onPremHost, want)
	if err := d.showChecked(ctx, out, func(s string) error {
		t, err := check.ParseTable(s)
		if err != nil {
			return err
		}
		got, err := t.Column("NAME", "AGENT CONNECTED")
		if err != nil {
			return err
		}
		if got[want] != "True" {
			return fmt.Errorf("%s: AGENT CONNECTED %q, want True", want, got[want])
		}
		for name, c := range got {
			if strings.Contains(name, "-aws-") && c == "True" {
				return nil
			}
		}
		return errors.New("no EC2 instance connected next to the on-prem host")
	}, "get", "war", "-n", "bookinfo"); err != nil {
		return err
	}
	return d.showChecked(ctx, out, func(s string) error {
		return check.Contains(s, want, "Jwt:", "Issuer:", issuer, "Short Name:", onPremShortName, "Subject:", onPremHost, onPremIP,
			runtimev1alpha1.ConditionAgentConnected, runtimev1alpha1.ReasonAgentEstablishedConnection)
	}, "describe", "war", "-n", "bookinfo", want)
}

// startOnPremAgent starts the host's application and its onboarding agent
// (the demo binary run as onboarding-agent, as for the EC2 instances) with
// a JWT credential: kubectl create token, run by the agent before each
// onboarding.
func (d *demo) startOnPremAgent(v *vm.VM, issuer string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if err := v.StartApp(onPremIP, d.appPort); err != nil {
		return err
	}
	kubectl := filepath.Join(mustAssets(), "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		if kubectl, err = exec.LookPath("kubectl"); err != nil {
			return fmt.Errorf("the host's credential plugin needs kubectl: %w", err)
		}
	}
	command := fmt.Sprintf("[%q, --kubeconfig, %q, create, token, %s, -n, %s, --audience, %s, --duration, 10m]",
		kubectl, d.env.KubeconfigPath, onPremHost, onPremNamespace, endpointHost)
	return v.StartAgent(d.tb, vm.Settings{Exe: exe, Endpoint: d.addrs.onboarding, ServerName: endpointHost, CAFile: d.serving.caFile,
		Host: vm.JWTHost(command), Address: onPremIP, Labels: vmLabels})
}
