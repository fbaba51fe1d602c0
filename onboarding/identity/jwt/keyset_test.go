package jwt_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	josejwt "github.com/go-jose/go-jose/v4/jwt"

	"github.com/embark-mesh/embark/onboarding/identity"
	"github.com/embark-mesh/embark/onboarding/identity/jwt"
)

// jwksServer is a loopback HTTPS server of one issuer's JWKS.
type jwksServer struct {
	*httptest.Server
	mu      sync.Mutex
	body    []byte
	status  int
	fetches int
}

func newJWKSServer(t *testing.T, body []byte) *jwksServer {
	t.Helper()
	s := &jwksServer{body: body, status: http.StatusOK}
	s.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.fetches++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(s.status)
		_, _ = w.Write(s.body)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) set(status int, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status, s.body = status, body
}

func (s *jwksServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetches
}

func remoteVerifier(t *testing.T, s *jwksServer, clock *fakeClock) *jwt.Verifier {
	t.Helper()
	v, err := jwt.NewVerifier([]jwt.IssuerConfig{{
		Issuer: testIssuer, ShortName: "corp", Audiences: []string{testAudience}, JWKSURL: s.URL + "/keys",
	}}, jwt.WithClock(clock.Now), jwt.WithHTTPClient(s.Client()), jwt.WithJWKSRefresh(time.Hour, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// step is one verification in a scenario, after advancing the clock and
// changing the server.
type step struct {
	advance     time.Duration
	serve       func(t *testing.T, s *jwksServer) // change what the server answers
	key         testKey
	wantReason  identity.Reason
	wantFetches int // total fetches after the step
}

func TestRemoteJWKS(t *testing.T) {
	k := testKeys(t)
	serveKeys := func(ks ...testKey) func(t *testing.T, s *jwksServer) {
		return func(t *testing.T, s *jwksServer) { s.set(http.StatusOK, jwks(t, ks...)) }
	}
	serveStatus := func(status int) func(t *testing.T, s *jwksServer) {
		return func(t *testing.T, s *jwksServer) { s.set(status, []byte("oops")) }
	}
	tests := []struct {
		name    string
		initial []testKey // nil: the server fails at first
		steps   []step
	}{
		{
			name:    "fetched lazily once, then cached",
			initial: []testKey{k.rsa},
			steps: []step{
				{key: k.rsa, wantFetches: 1},
				{advance: 10 * time.Minute, key: k.rsa, wantFetches: 1},
			},
		},
		{
			name:    "refreshed after the refresh interval",
			initial: []testKey{k.rsa},
			steps: []step{
				{key: k.rsa, wantFetches: 1},
				{advance: time.Hour, key: k.rsa, wantFetches: 2},
			},
		},
		{
			name:    "unknown kid refetches, rate-limited by the minimum interval",
			initial: []testKey{k.rsa},
			steps: []step{
				{key: k.rsa, wantFetches: 1},
				// The issuer rotates to a new key: the first token with the new
				// kid comes too soon after the last fetch.
				{serve: serveKeys(k.rsa, k.ec256), key: k.ec256, wantReason: identity.ReasonUnknownKey, wantFetches: 1},
				{advance: 31 * time.Second, key: k.ec256, wantFetches: 2},
				// A kid that does not exist triggers at most one fetch per interval.
				{advance: 31 * time.Second, key: k.ed, wantReason: identity.ReasonUnknownKey, wantFetches: 3},
				{key: k.ed, wantReason: identity.ReasonUnknownKey, wantFetches: 3},
				{advance: 10 * time.Second, key: k.ed, wantReason: identity.ReasonUnknownKey, wantFetches: 3},
				{key: k.rsa, wantFetches: 3},
			},
		},
		{
			name:    "failed refresh keeps the last good key set",
			initial: []testKey{k.rsa},
			steps: []step{
				{key: k.rsa, wantFetches: 1},
				{advance: time.Hour, serve: serveStatus(http.StatusInternalServerError), key: k.rsa, wantFetches: 2},
				{advance: time.Minute, key: k.rsa, wantFetches: 3},
			},
		},
		{
			name:    "keys older than the maximum key age are dropped while the issuer is down",
			initial: []testKey{k.rsa},
			steps: []step{
				{key: k.rsa, wantFetches: 1},
				{advance: time.Hour, serve: serveStatus(http.StatusInternalServerError), key: k.rsa, wantFetches: 2},
				{advance: 22 * time.Hour, key: k.rsa, wantFetches: 3},
				{advance: time.Hour, key: k.rsa, wantReason: identity.ReasonKeySetUnavailable, wantFetches: 4},
			},
		},
		{
			name:    "issuer down from the start, retried after the minimum interval",
			initial: nil,
			steps: []step{
				{key: k.rsa, wantReason: identity.ReasonKeySetUnavailable, wantFetches: 1},
				{key: k.rsa, wantReason: identity.ReasonKeySetUnavailable, wantFetches: 1},
				{advance: 31 * time.Second, serve: serveKeys(k.rsa), key: k.rsa, wantFetches: 2},
			},
		},
		{
			name:    "garbage key set",
			initial: nil,
			steps: []step{
				{serve: func(t *testing.T, s *jwksServer) { s.set(http.StatusOK, []byte(`{"keys": 7}`)) }, key: k.rsa, wantReason: identity.ReasonKeySetUnavailable, wantFetches: 1},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newJWKSServer(t, nil)
			if tt.initial != nil {
				s.set(http.StatusOK, jwks(t, tt.initial...))
			} else {
				s.set(http.StatusServiceUnavailable, nil)
			}
			clock := newFakeClock()
			v := remoteVerifier(t, s, clock)
			for i, st := range tt.steps {
				clock.Advance(st.advance)
				if st.serve != nil {
					st.serve(t, s)
				}
				claims := josejwt.Claims{Issuer: testIssuer, Subject: "vm", Audience: josejwt.Audience{testAudience}, Expiry: josejwt.NewNumericDate(clock.Now().Add(time.Hour))}
				_, err := v.Verify(t.Context(), mint(t, st.key, "", nil, claims))
				if got := identity.ReasonOf(err); got != st.wantReason {
					t.Fatalf("step %d: Verify() = %v, want reason %q", i, err, st.wantReason)
				}
				if got := s.count(); got != st.wantFetches {
					t.Fatalf("step %d: %d JWKS fetches, want %d", i, got, st.wantFetches)
				}
			}
		})
	}
}

// Many concurrent verifications needing the key set share one fetch.
func TestRemoteJWKSConcurrentFirstUse(t *testing.T) {
	k := testKeys(t)
	s := newJWKSServer(t, jwks(t, k.rsa))
	clock := newFakeClock()
	v := remoteVerifier(t, s, clock)
	claims := josejwt.Claims{Issuer: testIssuer, Subject: "vm", Audience: josejwt.Audience{testAudience}, Expiry: josejwt.NewNumericDate(clock.Now().Add(time.Hour))}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		token := mint(t, k.rsa, "", nil, claims) // each its own jti
		wg.Go(func() {
			if _, err := v.Verify(t.Context(), token); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := s.count(); got != 1 {
		t.Errorf("%d JWKS fetches, want 1", got)
	}
}
