package main

import (
	"fmt"
	"strings"
	"testing"
)

func TestNextToOthers(t *testing.T) {
	const ecs = "ratings-aws-aws-123456789012-us-east-2-ecs-prod-158d1c8083dd49d6b527399fd6414f5c"
	const ec2 = "ratings-aws-aws-123456789012-us-east-2b-ec2-i-1234567890abcdef0"
	const jwt = "ratings-jwt-kube-vm-01.example.com-5c0268f7e9610b37"
	// table lays rows out as kubectl get war does: aligned columns.
	table := func(rows ...[2]string) string {
		s := fmt.Sprintf("%-90s%-18s%s\n", "NAME", "AGENT CONNECTED", "AGE")
		for _, r := range rows {
			s += fmt.Sprintf("%-90s%-18s%s\n", r[0], r[1], "1s")
		}
		return s
	}
	for _, tc := range []struct {
		name, table string
		wantErr     string
	}{
		{"all connected", table([2]string{ecs, "True"}, [2]string{ec2, "True"}, [2]string{jwt, "True"}), ""},
		{"not connected", table([2]string{ecs, "False"}, [2]string{ec2, "True"}, [2]string{jwt, "True"}), "want True"},
		{"not listed", table([2]string{ec2, "True"}, [2]string{jwt, "True"}), "want True"},
		{"no EC2 instance (an ECS task is none)", table([2]string{ecs, "True"}, [2]string{jwt, "True"}), "not next to"},
		{"EC2 instance disconnected", table([2]string{ecs, "True"}, [2]string{ec2, "False"}, [2]string{jwt, "True"}), "not next to"},
		{"no on-prem host", table([2]string{ecs, "True"}, [2]string{ec2, "True"}), "not next to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := (&demo{}).nextToOthers(tc.table, ecs)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("nextToOthers: %v, want error %q", err, tc.wantErr)
			}
		})
	}
}

func TestDescribes(t *testing.T) {
	const out = `Name:         ratings-gcp-embark-test-us-central1-a-gce-5180367924151823417
Spec:
  Identity:
    Gcp:
      Project Id:       embark-test
      Zone:             us-central1-a
  Registration:
    Host:
      Addresses:
        Ip:    127.0.1.62
    Reason:                AgentEstablishedConnection
    Type:                  AgentConnected
`
	const name = "ratings-gcp-embark-test-us-central1-a-gce-5180367924151823417"
	for _, tc := range []struct {
		name   string
		ip     string
		fields [][2]string
		ok     bool
	}{
		{"fields shown", "127.0.1.62", [][2]string{{"Project Id", "embark-test"}, {"Zone", "us-central1-a"}}, true},
		{"other value", "127.0.1.62", [][2]string{{"Project Id", "embark-other"}}, false},
		{"value prefix only", "127.0.1.62", [][2]string{{"Project Id", "embark"}}, false},
		{"field missing", "127.0.1.62", [][2]string{{"Instance Id", "5180367924151823417"}}, false},
		{"other address", "127.0.1.72", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := describes(out, name, tc.ip, tc.fields); (err == nil) != tc.ok {
				t.Errorf("describes: %v, want ok %v", err, tc.ok)
			}
		})
	}
}

func TestRequestID(t *testing.T) {
	line := `level=WARN msg="onboarding refused; retrying" code=PermissionDenied message="not authorized to onboard (request id cbdac54c09c5fc39)" hint="..."`
	if m := requestID.FindStringSubmatch(line); m == nil || m[1] != "cbdac54c09c5fc39" {
		t.Errorf("request id of %q: %v", line, m)
	}
	if m := requestID.FindStringSubmatch(`code=Unavailable message="connection refused"`); m != nil {
		t.Errorf("request id found in a line without one: %v", m)
	}
}

func TestAsked(t *testing.T) {
	if _, err := asked("seen", 1, 2); err != nil {
		t.Errorf("asked with every count > 0: %v", err)
	}
	if _, err := asked("seen", 1, 0); err == nil {
		t.Error("asked with a zero count: no error")
	}
}
