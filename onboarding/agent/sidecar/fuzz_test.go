package sidecar

import (
	"strings"
	"testing"
)

// FuzzParseClusterEnv: whatever ParseClusterEnv admits renders back to a
// file it admits with the same values, holding only allowed KEY='...' lines
// (what a root shell sources).
func FuzzParseClusterEnv(f *testing.F) {
	if env, err := ClusterEnv(Identity{Namespace: "ns", RegistrationName: "vm"}, testBootstrap(), EnvOptions{Revision: "r"}); err == nil {
		f.Add(env)
	}
	f.Add([]byte("ISTIO_CUSTOM_IP_TABLES='true'\nISTIO_INBOUND_INTERCEPTION_MODE='NONE'\nISTIO_META_INTERCEPTION_MODE='NONE'\nPOD_NAME='a'\\''b'\n"))
	f.Add([]byte("POD_NAME=$(id)\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		vars, err := ParseClusterEnv(data)
		if err != nil {
			return
		}
		out, err := renderEnv(vars)
		if err != nil {
			t.Fatalf("admitted %q but cannot render it: %v", data, err)
		}
		again, err := ParseClusterEnv(out)
		if err != nil {
			t.Fatalf("rendered file refused: %v\n%s", err, out)
		}
		for k, v := range vars {
			if again[k] != v {
				t.Fatalf("%s changed: %q -> %q", k, v, again[k])
			}
		}
		for _, line := range strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")[1:] {
			k, v, _ := strings.Cut(line, "=")
			if !clusterEnvKeys[k] || !strings.HasPrefix(v, "'") || !strings.HasSuffix(v, "'") {
				t.Fatalf("rendered line %q", line)
			}
		}
	})
}

// FuzzCanonicalCerts: the roots an endpoint sends (installed by InstallRoots
// and the roots request) are admitted only as PEM certificates, and what is
// admitted re-encodes to itself: a fixed point holding certificates alone.
func FuzzCanonicalCerts(f *testing.F) {
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := canonicalCerts(data)
		if err != nil {
			return
		}
		again, err := canonicalCerts(out)
		if err != nil {
			t.Fatalf("admitted %q but refuses its canonical form: %v", data, err)
		}
		if string(again) != string(out) {
			t.Fatalf("canonical form is not a fixed point:\n%s\n%s", out, again)
		}
		if n := strings.Count(string(out), "-----BEGIN "); n != strings.Count(string(out), "-----BEGIN CERTIFICATE-----") || n == 0 {
			t.Fatalf("canonical form holds something but certificates:\n%s", out)
		}
	})
}
