package agent

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/embark-mesh/embark/onboarding/agent/config"
	"github.com/embark-mesh/embark/onboarding/agent/platform"
)

const (
	testEndpoint = "onboarding.example.com:15443"
	testGroup    = "bookinfo/ratings"
)

var testNow = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

func validStored() storedSession {
	return storedSession{
		Version: sessionFileVersion, Endpoint: testEndpoint, WorkloadGroup: testGroup,
		Token: "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln", IssuedAt: testNow.Add(-10 * time.Minute), ExpiresAt: testNow.Add(50 * time.Minute),
		SessionKey: strings.Repeat("ab", 32),
	}
}

func encodeStored(t testing.TB, st storedSession) []byte {
	t.Helper()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A session file is used only when it is well formed, kept for this
// endpoint and WorkloadGroup, and its onboarding token is unexpired.
func TestParseSession(t *testing.T) {
	with := func(mutate func(*storedSession)) []byte {
		st := validStored()
		mutate(&st)
		return encodeStored(t, st)
	}
	for _, tc := range []struct {
		name    string
		data    []byte
		wantErr string
	}{
		{name: "valid", data: with(func(*storedSession) {})},
		{name: "empty", data: nil, wantErr: "not a session"},
		{name: "not JSON", data: []byte("session"), wantErr: "not a session"},
		{name: "truncated", data: encodeStored(t, validStored())[:40], wantErr: "not a session"},
		{name: "unknown field", data: []byte(`{"version":1,"extra":true}`), wantErr: "not a session"},
		{name: "two objects", data: append(encodeStored(t, validStored()), encodeStored(t, validStored())...), wantErr: "data after"},
		{name: "too large", data: bytes.Repeat([]byte(" "), maxSessionFile+1), wantErr: "more than"},
		{name: "another version", data: with(func(s *storedSession) { s.Version = 2 }), wantErr: "version 2"},
		{name: "another endpoint", data: with(func(s *storedSession) { s.Endpoint = "other.example.com:15443" }), wantErr: "kept for endpoint"},
		{name: "another WorkloadGroup", data: with(func(s *storedSession) { s.WorkloadGroup = "bookinfo/reviews" }), wantErr: "kept for endpoint"},
		{name: "no token", data: with(func(s *storedSession) { s.Token = "" }), wantErr: "token"},
		{name: "token with a newline", data: with(func(s *storedSession) { s.Token = "a\nb" }), wantErr: "token"},
		{name: "token too long", data: with(func(s *storedSession) { s.Token = strings.Repeat("a", maxStoredToken+1) }), wantErr: "token"},
		{name: "no session key", data: with(func(s *storedSession) { s.SessionKey = "" }), wantErr: "sessionKey"},
		{name: "session key too long", data: with(func(s *storedSession) { s.SessionKey = strings.Repeat("a", maxSessionKey+1) }), wantErr: "sessionKey"},
		{name: "session key not ASCII", data: with(func(s *storedSession) { s.SessionKey = "clé" }), wantErr: "sessionKey"},
		{name: "expired", data: with(func(s *storedSession) { s.ExpiresAt = testNow }), wantErr: "expired"},
		{name: "expiry before issue", data: with(func(s *storedSession) { s.IssuedAt = s.ExpiresAt.Add(time.Second) }), wantErr: "not after issuedAt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := parseSession(tc.data, testEndpoint, testGroup, testNow)
			if tc.wantErr == "" {
				if err != nil || st == nil || *st != validStored() {
					t.Fatalf("parseSession() = %+v, %v; want %+v", st, err, validStored())
				}
				return
			}
			if err == nil || st != nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("parseSession() = %+v, %v; want an error naming %q", st, err, tc.wantErr)
			}
		})
	}
}

// FuzzParseSession feeds arbitrary file contents to parseSession: it must
// not panic, and what it accepts is a session of this endpoint and group
// with an unexpired token that writes back to an equal session.
func FuzzParseSession(f *testing.F) {
	f.Add(encodeStored(f, validStored()))
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := parseSession(data, testEndpoint, testGroup, testNow)
		if err != nil {
			if st != nil {
				t.Fatalf("parseSession returned a session and the error %v", err)
			}
			return
		}
		if st.Endpoint != testEndpoint || st.WorkloadGroup != testGroup || !st.ExpiresAt.After(testNow) ||
			!printable(st.Token, maxStoredToken) || !printable(st.SessionKey, maxSessionKey) {
			t.Fatalf("accepted %q as %+v", data, st)
		}
		again, err := parseSession(encodeStored(t, *st), testEndpoint, testGroup, testNow)
		if err != nil || !again.ExpiresAt.Equal(st.ExpiresAt) || again.Token != st.Token || again.SessionKey != st.SessionKey {
			t.Fatalf("accepted %q but not its own encoding: %+v, %v", data, again, err)
		}
	})
}

// testAgent is an Agent of the test endpoint and group with state
// directory dir, logging to logs; it never connects.
func testAgent(t *testing.T, dir string, logs *bytes.Buffer) *Agent {
	t.Helper()
	onb := &config.OnboardingConfiguration{}
	onb.OnboardingEndpoint.Host = testEndpoint
	onb.Workload.Namespace, onb.Workload.Name = "bookinfo", "ratings"
	a, err := New(Options{Agent: &config.AgentConfiguration{StateDirectory: dir}, Onboarding: onb, Platform: testPlatform(t),
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.conn.Close() })
	return a
}

// The session an agent keeps (0600, atomically replaced) is the one the
// next agent with the same state directory starts with; a stale or
// corrupt file is logged, removed and replaced by a new session key.
func TestSessionKeptAcrossRestarts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	var logs bytes.Buffer
	first := testAgent(t, dir, &logs)
	first.restoreSession()
	s := first.current()
	if len(s.sessionKey) != 64 || s.token != "" {
		t.Fatalf("a new agent's session: key %q, token %q; want a new 64-digit key and no token", s.sessionKey, s.token)
	}
	if other := testAgent(t, t.TempDir(), &logs); func() string { other.restoreSession(); return other.current().sessionKey }() == s.sessionKey {
		t.Fatal("two agents made the same session key")
	}
	first.saveSession() // no onboarding token yet: nothing is kept
	if _, err := os.Stat(filepath.Join(dir, SessionFileName)); !os.IsNotExist(err) {
		t.Fatalf("a session without an onboarding token was kept (%v)", err)
	}

	issued := time.Now().Truncate(time.Second)
	first.setSession(&session{token: "onboarding.token.1", tokenIssued: issued, tokenExpiry: issued.Add(time.Hour), sessionKey: s.sessionKey})
	first.saveSession()
	path := filepath.Join(dir, SessionFileName)
	for p, want := range map[string]os.FileMode{path: 0o600, dir: 0o700} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != want {
			t.Fatalf("%s: %v, %v; want mode %v", p, fi.Mode(), err, want)
		}
	}

	second := testAgent(t, dir, &logs)
	second.restoreSession()
	if got := second.current(); got.token != "onboarding.token.1" || got.sessionKey != s.sessionKey || !got.tokenExpiry.Equal(issued.Add(time.Hour)) || !got.tokenIssued.Equal(issued) {
		t.Fatalf("restored session %+v, want the kept one", got)
	}

	for name, content := range map[string]string{
		"corrupt": "{not json",
		"expired": string(encodeStored(t, storedSession{Version: 1, Endpoint: testEndpoint, WorkloadGroup: testGroup, Token: "t",
			IssuedAt: issued.Add(-2 * time.Hour), ExpiresAt: issued.Add(-time.Hour), SessionKey: s.sessionKey})),
	} {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			logs.Reset()
			a := testAgent(t, dir, &logs)
			a.restoreSession()
			if got := a.current(); got.token != "" || got.sessionKey == s.sessionKey || len(got.sessionKey) != 64 {
				t.Errorf("started with %+v from a %s file, want a new session", got, name)
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Errorf("the %s file was not removed (%v)", name, err)
			}
			if !strings.Contains(logs.String(), "ignoring the kept agent session") {
				t.Errorf("no log line about the %s file:\n%s", name, logs.String())
			}
		})
	}
}

// Without a state directory the session is kept in memory only.
func TestSessionInMemoryWithoutStateDirectory(t *testing.T) {
	var logs bytes.Buffer
	a := testAgent(t, "", &logs)
	a.restoreSession()
	a.setSession(&session{token: "t", tokenIssued: time.Now(), tokenExpiry: time.Now().Add(time.Hour), sessionKey: a.current().sessionKey})
	a.saveSession()
	if a.sessionFile() != "" || logs.Len() != 0 {
		t.Errorf("session file %q, logs %q; want none", a.sessionFile(), logs.String())
	}
}

// testPlatform is a JWT platform reading a file that does not exist: the
// tests never ask it for a credential.
func testPlatform(t *testing.T) platform.Platform {
	t.Helper()
	p, err := platform.NewJWT(config.JWTPlatform{TokenFile: filepath.Join(t.TempDir(), "jwt")})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
