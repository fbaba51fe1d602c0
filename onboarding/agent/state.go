package agent

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode"

	"github.com/embark-mesh/embark/onboarding/agent/sidecar"
)

// SessionFileName is the file in the agent's state directory
// (AgentConfiguration.StateDirectory) that keeps its session across
// restarts: the onboarding token and the session key.
const SessionFileName = "session.json"

// Bounds of what the session file may hold.
const (
	sessionFileVersion = 1
	maxSessionFile     = 64 << 10
	// maxStoredToken is the longest onboarding token kept
	// (token.MaxTokenLength).
	maxStoredToken = 16 << 10
	// maxSessionKey is the longest session key the endpoint reads.
	maxSessionKey = 128
)

// storedSession is the content of the session file. Endpoint and
// WorkloadGroup say which onboarding configuration it belongs to: a file
// of another endpoint or WorkloadGroup is stale.
type storedSession struct {
	Version       int       `json:"version"`
	Endpoint      string    `json:"endpoint"`
	WorkloadGroup string    `json:"workloadGroup"`
	Token         string    `json:"token"`
	IssuedAt      time.Time `json:"issuedAt"`
	ExpiresAt     time.Time `json:"expiresAt"`
	SessionKey    string    `json:"sessionKey"`
}

// parseSession reads a session file's content written for endpoint and
// group, refusing one that is malformed, of another configuration, or
// whose onboarding token expired at now.
func parseSession(data []byte, endpoint, group string, now time.Time) (*storedSession, error) {
	if len(data) > maxSessionFile {
		return nil, fmt.Errorf("%d bytes, more than %d", len(data), maxSessionFile)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var st storedSession
	if err := dec.Decode(&st); err != nil {
		return nil, fmt.Errorf("not a session: %w", err)
	}
	if dec.More() {
		return nil, errors.New("not a session: data after the JSON object")
	}
	switch {
	case st.Version != sessionFileVersion:
		return nil, fmt.Errorf("version %d, want %d", st.Version, sessionFileVersion)
	case st.Endpoint != endpoint || st.WorkloadGroup != group:
		return nil, fmt.Errorf("kept for endpoint %q and WorkloadGroup %q, not %q and %q", clip(st.Endpoint), clip(st.WorkloadGroup), endpoint, group)
	case !printable(st.Token, maxStoredToken):
		return nil, errors.New("token: missing, too long or not printable ASCII")
	case !printable(st.SessionKey, maxSessionKey):
		return nil, errors.New("sessionKey: missing, too long or not printable ASCII")
	case !st.ExpiresAt.After(st.IssuedAt):
		return nil, errors.New("expiresAt is not after issuedAt")
	case !st.ExpiresAt.After(now):
		return nil, fmt.Errorf("the onboarding token expired at %s", st.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return &st, nil
}

// printable says whether s is 1 to limit printable ASCII characters.
func printable(s string, limit int) bool {
	return s != "" && len(s) <= limit && strings.IndexFunc(s, func(r rune) bool { return r > unicode.MaxASCII || !unicode.IsPrint(r) || r == ' ' }) < 0
}

// clip shortens a string read from the file for a log line.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// sessionFile is the path of the session file; "" when the agent has no
// state directory and keeps its session in memory only.
func (a *Agent) sessionFile() string {
	if dir := a.opts.Agent.StateDirectory; dir != "" {
		return filepath.Join(dir, SessionFileName)
	}
	return ""
}

// workloadGroup is "<namespace>/<name>" of the configured WorkloadGroup.
func (a *Agent) workloadGroup() string {
	w := a.opts.Onboarding.Workload
	return w.Namespace + "/" + w.Name
}

// restoreSession starts the agent's session: the one kept in the session
// file while its onboarding token is unexpired, else a new session key.
// The agent sends both on Authorize and Register, so after a restart it
// proves it is the agent session that holds its registration (and, on
// Azure, that IMDS's cached token it presents again is its own). A stale
// or unreadable file is removed.
func (a *Agent) restoreSession() {
	if st := a.loadSession(); st != nil {
		a.setSession(&session{token: st.Token, tokenIssued: st.IssuedAt, tokenExpiry: st.ExpiresAt, sessionKey: st.SessionKey})
		a.log.Info("restored the agent session kept across restarts", "file", a.sessionFile(), "tokenExpiresAt", st.ExpiresAt)
		return
	}
	key, err := newSessionKey()
	if err != nil {
		// The endpoint makes one at Register.
		a.log.Error("cannot create a session key; the endpoint makes one", "error", err.Error())
		return
	}
	a.setSession(&session{sessionKey: key})
}

// loadSession reads the session file; nil when there is none or it is not
// usable (then it is removed).
func (a *Agent) loadSession() *storedSession {
	path := a.sessionFile()
	if path == "" {
		return nil
	}
	data, err := readLimited(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil {
		var st *storedSession
		if st, err = parseSession(data, a.opts.Onboarding.Address(), a.workloadGroup(), time.Now()); err == nil {
			return st
		}
	}
	a.log.Warn("ignoring the kept agent session; onboarding with a new one", "file", path, "reason", err.Error())
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		a.log.Error("cannot remove the kept agent session", "file", path, "error", err.Error())
	}
	return nil
}

// readLimited reads path, at most maxSessionFile+1 bytes.
func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	return io.ReadAll(io.LimitReader(f, maxSessionFile+1))
}

// saveSession writes the current session to the session file (0600, in a
// 0700 directory made if missing, replaced atomically). A failure is
// logged: the agent runs on with its session in memory.
func (a *Agent) saveSession() {
	path := a.sessionFile()
	s := a.current()
	if path == "" || s.token == "" || s.sessionKey == "" {
		return
	}
	data, err := json.Marshal(storedSession{
		Version: sessionFileVersion, Endpoint: a.opts.Onboarding.Address(), WorkloadGroup: a.workloadGroup(),
		Token: s.token, IssuedAt: s.tokenIssued, ExpiresAt: s.tokenExpiry, SessionKey: s.sessionKey,
	})
	if err == nil {
		if err = os.MkdirAll(filepath.Dir(path), 0o700); err == nil {
			err = sidecar.WriteAtomic(path, data, 0o600)
		}
	}
	if err != nil {
		a.log.Error("cannot keep the agent session for a restart", "file", path, "error", err.Error())
	}
}

// newSessionKey returns a random session key, as the endpoint makes them.
func newSessionKey() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate session key: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}
