package crds_test

import (
	"regexp"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	runtimev1alpha1 "github.com/embark-mesh/embark/api/runtime/v1alpha1"
)

// status.agent is shown by kubectl get war -o wide (AGENT VERSION, LAST
// ERROR) and by describe, and the CRD refuses a reason that is not a word
// or an overlong message even from a writer that skips the endpoint's
// checks.
func TestKubectlShowsTheAgentReport(t *testing.T) {
	ctx := t.Context()
	ns := env.Namespace(t)
	war := seedWAR(t, ns)
	if err := env.Client.Create(ctx, war); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	war.Status.Agent = &runtimev1alpha1.AgentStatus{
		Version:    "v1.4.0",
		LastError:  &runtimev1alpha1.AgentError{Reason: "PermissionDenied", Message: "not authorized to onboard (request id 0123456789abcdef)"},
		ReportedAt: &now,
	}
	if err := env.Client.Status().Update(ctx, war); err != nil {
		t.Fatal(err)
	}

	out, err := env.Kubectl(ctx, nil, "get", "war", "-n", ns, "-o", "wide")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for _, col := range []string{"AGENT VERSION", "LAST ERROR"} {
		got[col] = cell(lines[0], lines[len(lines)-1], col)
	}
	if got["AGENT VERSION"] != "v1.4.0" || got["LAST ERROR"] != "PermissionDenied" {
		t.Errorf("kubectl get war -o wide: AGENT VERSION %q, LAST ERROR %q, want v1.4.0 and PermissionDenied:\n%s", got["AGENT VERSION"], got["LAST ERROR"], out)
	}

	desc, err := env.Kubectl(ctx, nil, "describe", "war", "-n", ns, seedWARName)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range [][2]string{
		{"Version", "v1.4.0"},
		{"Reason", "PermissionDenied"},
		{"Message", "not authorized to onboard (request id 0123456789abcdef)"},
	} {
		line := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(want[0]) + `:\s+` + regexp.QuoteMeta(want[1]) + `$`)
		if !line.MatchString(desc) {
			t.Errorf("kubectl describe war lacks %q: %q:\n%s", want[0], want[1], desc)
		}
	}
	if !strings.Contains(desc, "Last Error:") || !strings.Contains(desc, "Reported At:") {
		t.Errorf("kubectl describe war lacks Last Error and Reported At:\n%s", desc)
	}

	for _, bad := range []runtimev1alpha1.AgentError{
		{Reason: "None   Healthy"},
		{Reason: "Unavailable", Message: strings.Repeat("x", 257)},
	} {
		war.Status.Agent.LastError = &bad
		if err := env.Client.Status().Update(ctx, war); !apierrors.IsInvalid(err) {
			t.Errorf("status.agent.lastError %q/%d bytes: %v, want Invalid", bad.Reason, len(bad.Message), err)
		}
	}
}

// cell is the value under header column col in a row of kubectl's table:
// the row's text from where the column's header starts to where the next
// one starts (empty cells leave only spaces).
func cell(header, row, col string) string {
	start := strings.Index(header, col)
	if start < 0 || start >= len(row) {
		return ""
	}
	end := len(row)
	if next := regexp.MustCompile(`\s{2,}\S`).FindStringIndex(header[start+len(col):]); next != nil {
		end = min(end, start+len(col)+next[1]-1)
	}
	return strings.TrimSpace(row[start:end])
}
