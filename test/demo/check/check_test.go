package check

import (
	"strings"
	"testing"
)

const (
	warA = "ratings-aws-aws-123456789012-us-east-2b-ec2-i-0de00000000000001"
	warB = "ratings-aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0"
)

// Output as kubectl 1.35 prints it for the WAR CRD's printer columns.
const getWARs = `NAMESPACE   NAME                                                              AGENT CONNECTED   AGE
bookinfo    ratings-aws-aws-123456789012-us-east-2b-ec2-i-0de00000000000001   True              1s
bookinfo    ratings-aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0                     2s
`

func TestCheckWARs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		out     string
		want    map[string]string
		wantErr string
	}{
		{name: "as expected, an unset condition reads empty", out: getWARs,
			want: map[string]string{"bookinfo/" + warA: "True", "bookinfo/" + warB: ""}},
		{name: "not connected", out: getWARs,
			want: map[string]string{"bookinfo/" + warA: "True", "bookinfo/" + warB: "True"}, wantErr: `AGENT CONNECTED is "", want "True"`},
		{name: "missing", out: getWARs,
			want: map[string]string{"bookinfo/" + warA: "True", "bookinfo/" + warB: "", "bookinfo/x": "True"}, wantErr: "registration bookinfo/x is not listed"},
		{name: "one too many", out: getWARs,
			want: map[string]string{"bookinfo/" + warA: "True"}, wantErr: "bookinfo/" + warB + " is listed but should not be"},
		{name: "none, as expected", out: "", want: map[string]string{}},
		{name: "none", out: "", want: map[string]string{"bookinfo/" + warA: "True"}, wantErr: "bookinfo/" + warA + " is not listed"},
		{name: "not the WAR table", out: "NAME   AGE\nx      1s\n", want: map[string]string{}, wantErr: "has no NAMESPACE column"},
		{name: "header only lists nothing", out: "NAMESPACE   NAME   AGENT CONNECTED   AGE\n", want: map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := WARs(tc.out, tc.want)
			checkErr(t, err, tc.wantErr)
		})
	}
}

// Output as istioctl 1.31 prints it against Embark's debug listener.
const proxyStatus = `NAME                                                                         CLUSTER        ISTIOD            VERSION      SUBSCRIBED TYPES
ratings-aws-aws-123456789012-us-east-2b-ec2-i-0de00000000000001.bookinfo     Kubernetes     embark-demo-0     1.31-dev     4 (CDS,LDS,EDS,RDS)
ratings-aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0.bookinfo     Kubernetes     embark-demo-1     1.31-dev     4 (CDS,LDS,EDS,RDS)
`

func TestCheckProxyStatus(t *testing.T) {
	for _, tc := range []struct {
		name    string
		out     string
		want    map[string]string
		wantErr string
	}{
		{name: "as expected", out: proxyStatus, want: map[string]string{warA + ".bookinfo": "embark-demo-0", warB + ".bookinfo": "embark-demo-1"}},
		{name: "other replica", out: proxyStatus, want: map[string]string{warA + ".bookinfo": "embark-demo-0", warB + ".bookinfo": "embark-demo-0"},
			wantErr: `ISTIOD is "embark-demo-1", want "embark-demo-0"`},
		{name: "gone", out: proxyStatus, want: map[string]string{warA + ".bookinfo": "embark-demo-0"}, wantErr: "listed but should not be"},
		{name: "not a table of proxies", out: "NAME   AGE\nx      1s\n", want: map[string]string{}, wantErr: "columns NAME and ISTIOD expected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkErr(t, ProxyStatus(tc.out, tc.want), tc.wantErr)
		})
	}
}

func TestParseTableReadsCellsWithSpaces(t *testing.T) {
	out := "NAME   LDS          CDS\nvm-1   NOT SENT     SYNCED (3s)\nvm-2                STALE\n"
	tb, err := ParseTable(out)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]map[string]string{
		"LDS": {"vm-1": "NOT SENT", "vm-2": ""},
		"CDS": {"vm-1": "SYNCED (3s)", "vm-2": "STALE"},
	} {
		got, err := tb.Column("NAME", name)
		if err != nil {
			t.Fatal(err)
		}
		if err := Compare("proxy", name, got, want); err != nil {
			t.Error(err)
		}
	}
}

func TestCheckContains(t *testing.T) {
	checkErr(t, Contains("Reason: AgentEstablishedConnection\nReplica: r-0", "AgentEstablishedConnection", "r-0"), "")
	checkErr(t, Contains("Reason: AgentDisconnected", "AgentEstablishedConnection", "r-0"), `lacks "AgentEstablishedConnection", "r-0"`)
}

func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("unexpected error: %v", err)
	case want != "" && err == nil:
		t.Errorf("no error, want one containing %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Errorf("error %q, want one containing %q", err, want)
	}
}

func TestCheckSynced(t *testing.T) {
	out := `NAME                  CLUSTER        CDS               LDS               EDS          RDS          ECDS         ISTIOD            VERSION
vm-1.bookinfo         Kubernetes     SYNCED (2s)       SYNCED (2s)       NOT SENT     NOT SENT     NOT SENT     embark-demo-0     1.31-dev
vm-2.bookinfo         Kubernetes     SYNCED (1s)       STALE (1s)        NOT SENT     NOT SENT     NOT SENT     embark-demo-0     1.31-dev
`
	checkErr(t, Synced(out, 2, "CDS"), "")
	checkErr(t, Synced(out, 2, "CDS", "LDS"), `vm-2.bookinfo: LDS is "STALE (1s)", want SYNCED`)
	checkErr(t, Synced(out, 3, "CDS"), "2 proxies listed, want 3")
	checkErr(t, Synced(out, 2, "XDS"), "columns NAME and XDS expected")
}
