package adversarial

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/embark-mesh/embark/onboarding/identity/azure/azuretest"
	"github.com/embark-mesh/embark/onboarding/identity/gce/gcetest"
)

// respellings returns other spellings of the compact JWS tok that a lax
// decoder reads as the same bytes: CR or LF inside a part (Go's base64
// skips both, and a JOSE library rebuilds the signing input from the
// decoded parts) and a signature whose last character differs only in the
// bits base64url leaves unused. GCE and Azure tokens carry no jti, so their
// replay record is keyed by the token's signature: a spelling the record
// has not seen, accepted as the same token, would be a second onboarding.
func respellings(t *testing.T, tok string) map[string]string {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || len(parts[2])%4 == 0 {
		t.Fatalf("token %q: want three parts and a signature with unused bits", tok)
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	sig := parts[2]
	last := strings.IndexByte(alphabet, sig[len(sig)-1])
	// A 2048-bit RSA signature is 342 characters: the last one carries 2
	// bits of the signature and 4 unused ones.
	unused := map[int]int{2: 0x0f, 3: 0x03}[len(sig)%4]
	flipped := alphabet[last^unused : last^unused+1]
	return map[string]string{
		"LF in the signature":          parts[0] + "." + parts[1] + "." + sig[:20] + "\n" + sig[20:],
		"CR LF in the payload":         parts[0] + "." + parts[1][:20] + "\r\n" + parts[1][20:] + "." + sig,
		"unused bits of the signature": parts[0] + "." + parts[1] + "." + sig[:len(sig)-1] + flipped,
	}
}

// replayRespelled onboards with tok once, then presents each of its
// respellings: every one must be refused Malformed.
func replayRespelled(t *testing.T, tok string, authorize func(string) error) {
	t.Helper()
	if err := authorize(tok); err != nil {
		t.Fatalf("first use: %v", err)
	}
	for name, again := range respellings(t, tok) {
		wantCode(t, name, authorize(again), codes.Unauthenticated, "Malformed")
	}
}

func TestGCETokenReplayedRespelled(t *testing.T) {
	Attack(t, "a captured GCE token is presented a second time spelled differently (CR/LF inside a part, unused base64 bits)")
	w := newGCEWorld(t)
	replayRespelled(t, w.token(gcetest.DefaultInstance(), audience), func(tok string) error {
		_, err := w.authorize(tok)
		return err
	})
}

func TestAzureTokenReplayedRespelled(t *testing.T) {
	Attack(t, "a captured Azure token is presented a second time spelled differently (CR/LF inside a part, unused base64 bits)")
	w := newAzureWorld(t)
	replayRespelled(t, w.token(azuretest.DefaultVM(), audience), func(tok string) error {
		_, err := w.authorize(tok)
		return err
	})
}
