package adversarial

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ProtonMail/go-crypto/openpgp"
	"github.com/ProtonMail/go-crypto/openpgp/armor"
	"github.com/ProtonMail/go-crypto/openpgp/packet"

	"github.com/embark-mesh/embark/onboarding/repository"
	"github.com/embark-mesh/embark/onboarding/repository/signing"
)

// A man in the middle (or a stale mirror) keeps a copy of the local
// repository's signed apt metadata and serves it to VMs later, so that they
// never see newer packages (a fixed agent or sidecar). The copy is validly
// signed by the repository's key; only its age gives it away. Real apt-get
// update must refuse a snapshot older than its validity, and accept the
// repository's current one. The snapshot here is what the repository served
// 30 days ago (its clock set back), signed with its real key.
func TestFrozenRepositoryMetadata(t *testing.T) {
	Attack(t, "repository: an old, validly signed apt snapshot replayed to a VM is accepted forever")
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Fatalf("apt-get is needed (apt-get install --no-install-recommends apt): %v", err)
	}
	priv, pub := openPGPKey(t)
	signer, err := signing.New(priv)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(t.TempDir(), "embark.asc")
	if err := os.WriteFile(keyFile, pub, 0o644); err != nil {
		t.Fatal(err)
	}
	serve := func(now func() time.Time) string {
		h, err := repository.New(t.TempDir(), slog.New(slog.DiscardHandler), repository.WithSigner(signer), repository.WithClock(now))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return srv.URL
	}
	monthAgo := time.Now().Add(-30 * 24 * time.Hour)
	replayed := serve(func() time.Time { return monthAgo })
	current := serve(time.Now)

	out, err := newAptUpdate(t, keyFile, current).run()
	if err != nil || strings.Contains(out, "E: ") || strings.Contains(out, "W: ") {
		t.Fatalf("apt-get update from the repository's current metadata: %v\n%s", err, out)
	}
	apt := newAptUpdate(t, keyFile, replayed)
	out, err = apt.run()
	t.Logf("apt-get update from a 30-day-old snapshot:\n%s", out)
	if err == nil && !strings.Contains(out, "is expired") {
		t.Fatal("apt-get update accepted a 30-day-old signed snapshot")
	}
	if !strings.Contains(out, "is expired") {
		t.Errorf("apt-get update failed, but not because the metadata expired: %v", err)
	}
	if lists := apt.packagesLists(); len(lists) > 0 {
		t.Errorf("apt stored the expired snapshot's package lists: %v", lists)
	}
}

// aptUpdate is a throwaway apt configuration (own sources, lists, cache,
// empty dpkg status; only the repository's key trusted) whose one source is
// base/install/ stable main, as docs/vm-install.md sets up a VM.
type aptUpdate struct {
	t    *testing.T
	dir  string
	opts []string
}

func newAptUpdate(t *testing.T, keyFile, base string) *aptUpdate {
	t.Helper()
	d := t.TempDir()
	for _, sub := range []string{"etc/apt/sources.list.d", "etc/apt/trusted.gpg.d", "etc/apt/preferences.d", "var/lib/apt/lists/partial", "var/cache/apt/archives/partial", "var/lib/dpkg"} {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"var/lib/dpkg/status":  "",
		"apt.conf":             "",
		"etc/apt/sources.list": fmt.Sprintf("deb [signed-by=%s] %s/install/ stable main\n", keyFile, base),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(d, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return &aptUpdate{t: t, dir: d, opts: []string{
		"-o", "Dir=" + d,
		"-o", "Dir::State::status=" + filepath.Join(d, "var/lib/dpkg/status"),
		"-o", "Dir::Etc::trusted=" + filepath.Join(d, "etc/apt/trusted.gpg"),
		"-o", "Dir::Etc::trustedparts=" + filepath.Join(d, "etc/apt/trusted.gpg.d"),
		"-o", "APT::Architecture=amd64", "-o", "APT::Architectures::=amd64",
		"-o", "Acquire::Languages=none",
		"-o", "APT::Sandbox::User=root", // the throwaway directories are root's
		"-o", "Debug::NoLocking=1",
		"-o", "Acquire::Retries=0",
		// apt's defaults, which a host's apt.conf.d may turn off (this
		// test must not inherit that): Valid-Until and Date are checked.
		"-o", "Acquire::Check-Valid-Until=true",
		"-o", "Acquire::Check-Date=true",
	}}
}

// run runs apt-get update.
func (a *aptUpdate) run() (string, error) {
	cmd := exec.CommandContext(a.t.Context(), "apt-get", append(append([]string{"-q"}, a.opts...), "update")...)
	cmd.Dir = a.dir
	cmd.Env = append(os.Environ(), "APT_CONFIG="+filepath.Join(a.dir, "apt.conf"), "LC_ALL=C") // not the host's configuration
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// packagesLists are the package lists apt stored.
func (a *aptUpdate) packagesLists() []string {
	lists, _ := filepath.Glob(filepath.Join(a.dir, "var/lib/apt/lists/*_Packages*"))
	return lists
}

// openPGPKey returns a new armored OpenPGP private key (no passphrase) and
// its armored public key.
func openPGPKey(t *testing.T) (private, public []byte) {
	t.Helper()
	e, err := openpgp.NewEntity("repository", "test", "repository@example.invalid", &packet.Config{Algorithm: packet.PubKeyAlgoEdDSA})
	if err != nil {
		t.Fatal(err)
	}
	arm := func(typ string, write func(w *bytes.Buffer) error) []byte {
		var raw, out bytes.Buffer
		if err := write(&raw); err != nil {
			t.Fatal(err)
		}
		w, err := armor.Encode(&out, typ, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = w.Write(raw.Bytes())
		_ = w.Close()
		return out.Bytes()
	}
	private = arm(openpgp.PrivateKeyType, func(w *bytes.Buffer) error { return e.SerializePrivate(w, nil) })
	public = arm(openpgp.PublicKeyType, func(w *bytes.Buffer) error { return e.Serialize(w) })
	return private, public
}
