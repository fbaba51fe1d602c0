package endpointproc

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/embark-mesh/embark/test/testenv"
)

// Release is an earlier commit of this repository extracted into a
// directory of its own, with its onboarding-endpoint built there: the
// binary, CRDs and manifests an upgrade starts from.
type Release struct {
	// Commit is the full hash extracted.
	Commit string
	// Dir is the extracted tree (git archive of Commit).
	Dir string
	// Binary is its cmd/onboarding-endpoint, built in Dir.
	Binary string
}

// CRDDir is the release's chart CRDs directory, what docs/upgrade.md's
// step 1 applies.
func (r *Release) CRDDir() string {
	return filepath.Join(r.Dir, "manifests", "charts", "embark", "crds")
}

// BuildRelease extracts commit from the git repository holding this module
// into dir (git archive: no work tree, no checkout of the repository's own
// files) and builds its onboarding-endpoint there with the Go build cache.
// A commit the repository does not have (a shallow clone) is an error that
// says how to fetch it.
func BuildRelease(ctx context.Context, commit, dir string) (*Release, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, err
	}
	check := exec.CommandContext(ctx, "git", "-C", root, "cat-file", "-t", commit)
	if out, err := check.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "commit" {
		return nil, fmt.Errorf("commit %s is not in the repository at %s (a shallow clone? run `git fetch --unshallow`): %v: %s", commit, root, err, strings.TrimSpace(string(out)))
	}
	if err := archive(ctx, root, commit, dir); err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, "onboarding-endpoint")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/onboarding-endpoint")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./cmd/onboarding-endpoint of %s: %w: %s", commit, err, out)
	}
	return &Release{Commit: commit, Dir: dir, Binary: bin}, nil
}

// archive writes the tree of commit into dir.
func archive(ctx context.Context, root, commit, dir string) error {
	cmd := exec.CommandContext(ctx, "git", "-C", root, "archive", "--format=tar", commit)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("git archive %s: %w", commit, err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("git archive %s: %w", commit, err)
	}
	xerr := untar(out, dir)
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %w: %s", commit, err, stderr.String())
	}
	if xerr != nil {
		return fmt.Errorf("extract %s: %w", commit, xerr)
	}
	return nil
}

// untar extracts the regular files, directories and symbolic links of a tar
// stream under dir.
func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		path := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(path, filepath.Clean(dir)+string(filepath.Separator)) {
			return fmt.Errorf("archive entry %q leaves %s", h.Name, dir)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(path, 0o755)
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, path)
		case tar.TypeReg:
			err = writeFile(path, tr, os.FileMode(h.Mode).Perm())
		}
		if err != nil {
			return err
		}
	}
}

func writeFile(path string, r io.Reader, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
