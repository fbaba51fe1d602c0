package build

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// runInRunc runs the image's entrypoint with --version in runc, a real OCI
// runtime (no daemon): an OCI bundle of the unpacked rootfs with runc's
// default spec (read-only root, namespaces, no capabilities beyond the
// default set), the image's user, entrypoint and environment. It returns
// what the process printed.
func runInRunc(t *testing.T, runc, rootfs string, cfg *v1.ConfigFile) string {
	t.Helper()
	bundle := t.TempDir()
	if out, err := exec.CommandContext(t.Context(), runc, "spec", "--bundle", bundle).CombinedOutput(); err != nil {
		t.Fatalf("runc spec: %v: %s", err, out)
	}
	path := filepath.Join(bundle, "config.json")
	var spec map[string]any
	if err := json.Unmarshal(mustRead(t, path), &spec); err != nil {
		t.Fatal(err)
	}
	uidStr, gidStr, _ := strings.Cut(cfg.Config.User, ":")
	uid, err := strconv.Atoi(uidStr)
	if err != nil {
		t.Fatalf("image user %q is not numeric", cfg.Config.User)
	}
	gid, err := strconv.Atoi(gidStr)
	if err != nil {
		t.Fatalf("image user %q has no numeric group", cfg.Config.User)
	}
	process := spec["process"].(map[string]any)
	process["terminal"] = false
	process["args"] = append(append([]string(nil), cfg.Config.Entrypoint...), "--version")
	process["env"] = cfg.Config.Env
	process["cwd"] = cfg.Config.WorkingDir
	process["user"] = map[string]any{"uid": uid, "gid": gid}
	root := spec["root"].(map[string]any)
	root["path"] = rootfs // absolute: runc refuses a symlinked rootfs
	root["readonly"] = true
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}

	id := fmt.Sprintf("embark-image-test-%d", os.Getpid())
	t.Cleanup(func() { _ = exec.Command(runc, "delete", "--force", id).Run() })
	cmd := exec.CommandContext(t.Context(), runc, "run", "--bundle", bundle, id)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("runc run: %v: %s", err, out)
	}
	return string(out)
}
