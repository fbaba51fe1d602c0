// Package repository is the onboarding endpoint's local package repository:
// it serves the DEB and RPM packages of onboarding-agent and istio-sidecar
// that VMs install (docs/vm-install.md), from a directory that mirrors the URL tree
// below /install:
//
//	/install/{deb,rpm}/{amd64,arm64}/{onboarding-agent,istio-sidecar}.{deb,rpm}
//	/install/istio-sidecar/<revision>/{deb,rpm}/{amd64,arm64}/istio-sidecar.{deb,rpm}
//
// and, beside each, a .sha256 file the server computes, in the format
// `sha256sum --check` reads. More directories (WithExtraDirectories) are
// looked up after the first, in order: a path is served from the first
// directory that has it, and the apt and yum metadata index the packages
// of all of them (e.g. the agent's in the image's directory, Istio's
// istio-sidecar in a volume). Any other path is 404; the parser admits only
// these shapes, and files are opened through an os.Root per directory, so
// nothing outside the directories is reachable. Files are served with http.ServeContent (range
// requests, If-Modified-Since, If-None-Match) with a strong ETag (the
// content's SHA-256) and Cache-Control: no-cache (revalidate: a package may
// be replaced in place).
package repository

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/embark-mesh/embark/onboarding/repository/signing"
)

// Prefix is the URL prefix of every repository path.
const Prefix = "/install/"

// ChecksumSuffix is the suffix of checksum paths.
const ChecksumSuffix = ".sha256"

// Path is a parsed repository path.
type Path struct {
	// File is the package's path relative to the repository directory,
	// e.g. deb/amd64/onboarding-agent.deb; for a Generated path, the
	// path below /install/, e.g. dists/stable/InRelease.
	File string
	// Checksum is true for the .sha256 path beside File.
	Checksum bool
	// Generated is true for the apt and yum metadata and the public keys,
	// which the server generates from the packages (see metadataPath).
	Generated bool
}

// ErrNotFound means the URL path is not a repository path.
var ErrNotFound = errors.New("not a repository path")

// ParsePath parses a URL path of the repository. Anything but the shapes in
// the package comment is ErrNotFound.
func ParsePath(urlPath string) (Path, error) {
	rest, ok := strings.CutPrefix(urlPath, Prefix)
	if !ok {
		return Path{}, ErrNotFound
	}
	if metadataPath(rest) {
		return Path{File: rest, Generated: true}, nil
	}
	var p Path
	if r, ok := strings.CutSuffix(rest, ChecksumSuffix); ok {
		rest, p.Checksum = r, true
	}
	seg := strings.Split(rest, "/")
	var format, arch, name string
	switch len(seg) {
	case 3: // {deb,rpm}/{arch}/{package}.{format}
		format, arch, name = seg[0], seg[1], seg[2]
		pkg, ok := strings.CutSuffix(name, "."+format)
		if !ok || (pkg != "onboarding-agent" && pkg != "istio-sidecar") {
			return Path{}, ErrNotFound
		}
	case 5: // istio-sidecar/{revision}/{deb,rpm}/{arch}/istio-sidecar.{format}
		if seg[0] != "istio-sidecar" || !validRevision(seg[1]) {
			return Path{}, ErrNotFound
		}
		format, arch, name = seg[2], seg[3], seg[4]
		if name != "istio-sidecar."+format {
			return Path{}, ErrNotFound
		}
	default:
		return Path{}, ErrNotFound
	}
	if (format != "deb" && format != "rpm") || (arch != "amd64" && arch != "arm64") {
		return Path{}, ErrNotFound
	}
	p.File = rest
	return p, nil
}

// validRevision: an Istio revision is a DNS-1123 label.
func validRevision(s string) bool { return len(validation.IsDNS1123Label(s)) == 0 }

// Handler serves the repository.
type Handler struct {
	// roots are the directories, in lookup order (New's, then
	// WithExtraDirectories'); extra are the names of the latter.
	roots    []*os.Root
	extra    []string
	log      *slog.Logger
	signer   *signing.Signer
	now      func() time.Time
	validity time.Duration

	mu   sync.Mutex
	sums map[string]digest

	// genMu serializes regenerations; snap is the current metadata.
	genMu sync.Mutex
	snap  atomic.Pointer[snapshot]
}

// Option configures a Handler.
type Option func(*Handler)

// WithSigner signs the apt and yum metadata with s and publishes its public
// keys at /install/repository.asc. Without it the server serves the
// packages only: no unsigned metadata is ever served.
func WithSigner(s *signing.Signer) Option { return func(h *Handler) { h.signer = s } }

// DefaultValidity is how long a generated apt Release is valid (its
// Valid-Until is its Date plus this), see WithValidity.
const DefaultValidity = 7 * 24 * time.Hour

// WithValidity sets how long generated apt metadata is valid: each Release
// carries Valid-Until = Date + d, after which apt refuses it, so that an old
// signed snapshot (replayed by a man in the middle or served by a stale
// mirror) cannot hold a VM on old packages forever. The metadata is
// generated and signed again once half of d has passed, at the first
// request after that, so no client is ever served metadata with less than
// d/2 left. Zero or less: DefaultValidity.
func WithValidity(d time.Duration) Option {
	return func(h *Handler) {
		if d > 0 {
			h.validity = d
		}
	}
}

// WithExtraDirectories adds directories in the same layout, looked up
// after New's directory and each other in the given order: a path is
// served from the first directory that has it (so a package of New's
// directory is never replaced by one of these), and the metadata index
// the packages of every directory. Each must exist when New is called.
func WithExtraDirectories(dirs ...string) Option {
	return func(h *Handler) { h.extra = append(h.extra, dirs...) }
}

// WithClock sets the clock the metadata's dates come from. Default
// time.Now.
func WithClock(now func() time.Time) Option { return func(h *Handler) { h.now = now } }

// digest is a file's SHA-256 with the identity of the file version it was
// computed from. A version is the inode with its size, modification time
// and change time: a file replaced by rename is another inode, and a write
// in place sets the change time, which, unlike the modification time
// (touch -d), no unprivileged user can set back. Same size and
// modification time alone, the old key, kept a stale checksum and ETag
// after an in-place rewrite.
type digest struct {
	version fileVersion
	sum     string
	// pkg is the package's parsed metadata, filled when an index needs it.
	pkg *described
}

// New returns a Handler serving dir (and the WithExtraDirectories). Every
// directory must exist.
func New(dir string, log *slog.Logger, opts ...Option) (*Handler, error) {
	if log == nil {
		log = slog.Default()
	}
	h := &Handler{log: log, sums: map[string]digest{}, now: time.Now, validity: DefaultValidity}
	for _, o := range opts {
		o(h)
	}
	for _, d := range append([]string{dir}, h.extra...) {
		root, err := os.OpenRoot(d)
		if err != nil {
			_ = h.Close()
			return nil, fmt.Errorf("local repository: %w", err)
		}
		h.roots = append(h.roots, root)
	}
	return h, nil
}

// Close releases the directories.
func (h *Handler) Close() error {
	var errs []error
	for _, r := range h.roots {
		errs = append(errs, r.Close())
	}
	return errors.Join(errs...)
}

// open opens name in the first directory that has it.
func (h *Handler) open(name string) (*os.File, error) {
	for _, r := range h.roots[:len(h.roots)-1] {
		f, err := r.Open(name)
		if !errors.Is(err, fs.ErrNotExist) {
			return f, err
		}
	}
	return h.roots[len(h.roots)-1].Open(name)
}

// stat describes name in the first directory that has it.
func (h *Handler) stat(name string) (fs.FileInfo, error) {
	for _, r := range h.roots[:len(h.roots)-1] {
		info, err := r.Stat(name)
		if !errors.Is(err, fs.ErrNotExist) {
			return info, err
		}
	}
	return h.roots[len(h.roots)-1].Stat(name)
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	p, err := ParsePath(r.URL.Path)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	if p.Generated {
		h.serveGenerated(w, r, p.File)
		return
	}
	f, err := h.open(p.File)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			h.log.Error("local repository: open", "file", p.File, "error", err)
		}
		http.NotFound(w, r)
		return
	}
	defer func() { _ = f.Close() }()
	info, err := f.Stat()
	if err != nil || !info.Mode().IsRegular() {
		http.NotFound(w, r)
		return
	}
	sum, err := h.checksum(p.File, f, info)
	if err != nil {
		h.log.Error("local repository: checksum", "file", p.File, "error", err)
		http.Error(w, "cannot read the package", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Cache-Control", "no-cache")
	if p.Checksum {
		body := []byte(sum + "  " + path.Base(p.File) + "\n")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("ETag", `"`+sum+`.sha256"`)
		http.ServeContent(w, r, "", info.ModTime(), bytes.NewReader(body))
		return
	}
	if strings.HasSuffix(p.File, ".deb") {
		w.Header().Set("Content-Type", "application/vnd.debian.binary-package")
	} else {
		w.Header().Set("Content-Type", "application/x-rpm")
	}
	w.Header().Set("ETag", `"`+sum+`"`)
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		http.Error(w, "cannot read the package", http.StatusInternalServerError)
		return
	}
	http.ServeContent(w, r, "", info.ModTime(), f)
}

// checksum returns the hex SHA-256 of f's content, cached for the file
// version (see digest) it was computed from.
func (h *Handler) checksum(name string, f io.Reader, info fs.FileInfo) (string, error) {
	v, known := versionOf(info)
	h.mu.Lock()
	d, ok := h.sums[name]
	h.mu.Unlock()
	if ok && known && d.version == v {
		return d.sum, nil
	}
	sum, err := sha256Hex(f)
	if err != nil {
		return "", err
	}
	h.mu.Lock()
	h.sums[name] = digest{version: v, sum: sum}
	h.mu.Unlock()
	return sum, nil
}

// sha256Hex is the hex SHA-256 of what r reads.
func sha256Hex(r io.Reader) (string, error) {
	hash := sha256.New()
	if _, err := io.Copy(hash, r); err != nil {
		return "", err
	}
	return hex.EncodeToString(hash.Sum(nil)), nil
}
