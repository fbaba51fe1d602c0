package repository

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/embark-mesh/embark/onboarding/repository/debfile"
	"github.com/embark-mesh/embark/onboarding/repository/metadata"
	"github.com/embark-mesh/embark/onboarding/repository/rpmfile"
)

// The generated paths below /install/:
//
//	repository.asc                               the public keys (armored)
//	dists/<suite>/{InRelease,Release,Release.gpg}
//	dists/<suite>/main/binary-<arch>/{Packages,Packages.gz}
//	dists/<suite>/main/binary-<arch>/by-hash/SHA256/<sha256>
//	rpm/repodata/{repomd.xml,repomd.xml.asc,<sha256>-<kind>.xml.gz}
//	istio-sidecar/<revision>/rpm/repodata/...    the same per revision
//
// The apt archive root is /install/: suite "stable" holds the packages of
// deb/<arch>/, suite "revision-<revision>" the onboarding-agent packages
// with that revision's istio-sidecar. The yum repositories are
// /install/rpm/ and /install/istio-sidecar/<revision>/rpm/.
const (
	// PublicKeysPath is the armored public keys' path below /install/.
	PublicKeysPath = "repository.asc"
	// StableSuite is the apt suite of the unrevisioned packages.
	StableSuite = "stable"
	// RevisionSuitePrefix + <revision> is a revision's apt suite.
	RevisionSuitePrefix = "revision-"

	// maxRevisions bounds the revisions indexed (directory entries read).
	maxRevisions = 64
)

var (
	hashName     = `[0-9a-f]{64}`
	aptIndexRE   = regexp.MustCompile(`^main/binary-(amd64|arm64)/(Packages|Packages\.gz|by-hash/SHA256/` + hashName + `)$`)
	repodataRE   = regexp.MustCompile(`^repodata/(repomd\.xml|repomd\.xml\.asc|` + hashName + `-(primary|filelists|other)\.xml\.gz)$`)
	suiteFiles   = map[string]bool{"InRelease": true, "Release": true, "Release.gpg": true}
	archOfRPM    = map[string]string{"amd64": "x86_64", "arm64": "aarch64"}
	packageNames = []string{"onboarding-agent", "istio-sidecar"}
)

// metadataPath reports whether rest (the path below /install/) is one of
// the generated paths above.
func metadataPath(rest string) bool {
	if rest == PublicKeysPath {
		return true
	}
	if r, ok := strings.CutPrefix(rest, "dists/"); ok {
		suite, file, ok := strings.Cut(r, "/")
		if !ok || !validSuite(suite) {
			return false
		}
		return suiteFiles[file] || aptIndexRE.MatchString(file)
	}
	if r, ok := strings.CutPrefix(rest, "rpm/"); ok {
		return repodataRE.MatchString(r)
	}
	if r, ok := strings.CutPrefix(rest, "istio-sidecar/"); ok {
		rev, r, ok := strings.Cut(r, "/")
		if !ok || !validRevision(rev) {
			return false
		}
		r, ok = strings.CutPrefix(r, "rpm/")
		return ok && repodataRE.MatchString(r)
	}
	return false
}

func validSuite(s string) bool {
	if s == StableSuite {
		return true
	}
	rev, ok := strings.CutPrefix(s, RevisionSuitePrefix)
	return ok && validRevision(rev)
}

// snapshot is the metadata generated from one state of the directory.
type snapshot struct {
	state string
	at    time.Time
	// refreshAt is when the snapshot is generated and signed again though
	// no package changed: half-way to its Valid-Until.
	refreshAt time.Time
	files     map[string][]byte
	// old are the content-addressed files (by-hash, repodata/<sha256>-...)
	// of the previous snapshot: a client that read the previous InRelease
	// or repomd.xml finishes its update.
	old map[string][]byte
}

// described is a package's index facts (one of deb, rpm) or why it has none.
type described struct {
	size  int64
	mtime time.Time
	deb   *debfile.Control
	rpm   *rpmfile.Package
	err   error
}

// serveGenerated serves a generated file of the current snapshot.
func (h *Handler) serveGenerated(w http.ResponseWriter, r *http.Request, name string) {
	if h.signer == nil {
		http.NotFound(w, r)
		return
	}
	snap, err := h.current()
	if err != nil {
		h.log.Error("local repository: generate metadata", "error", err)
		http.Error(w, "cannot generate the repository metadata", http.StatusInternalServerError)
		return
	}
	data, ok := snap.files[name]
	if !ok {
		data, ok = snap.old[name]
	}
	if !ok {
		http.NotFound(w, r)
		return
	}
	switch {
	case strings.HasSuffix(name, ".gz") || strings.Contains(name, "/by-hash/"):
		w.Header().Set("Content-Type", "application/octet-stream")
	case strings.HasSuffix(name, ".xml"):
		w.Header().Set("Content-Type", "application/xml")
	case strings.HasSuffix(name, ".asc") || strings.HasSuffix(name, ".gpg"):
		w.Header().Set("Content-Type", "application/pgp-signature")
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	}
	sum := sha256.Sum256(data)
	w.Header().Set("ETag", `"`+hex.EncodeToString(sum[:])+`"`)
	w.Header().Set("Cache-Control", "no-cache")
	http.ServeContent(w, r, "", snap.at, bytes.NewReader(data))
}

// current returns the snapshot of the directory as it is now, generating
// it again when a package file was added, removed or changed, or when half
// of its validity has passed (see WithValidity).
func (h *Handler) current() (*snapshot, error) {
	files, state, err := h.packageFiles()
	if err != nil {
		return nil, err
	}
	if s := h.snap.Load(); h.fresh(s, state) {
		return s, nil
	}
	h.genMu.Lock()
	defer h.genMu.Unlock()
	prev := h.snap.Load()
	if h.fresh(prev, state) {
		return prev, nil
	}
	s, err := h.generate(files, state, prev)
	if err != nil {
		return nil, err
	}
	h.snap.Store(s)
	h.log.Info("local repository: metadata generated", "packages", len(files), "files", len(s.files))
	return s, nil
}

// fresh reports whether s may still be served for the directory state:
// same packages, and not yet half-way to its Valid-Until.
func (h *Handler) fresh(s *snapshot, state string) bool {
	return s != nil && s.state == state && h.now().Before(s.refreshAt)
}

// packageFiles lists the package files of the directory (paths below it)
// and a string that changes whenever one of them does.
func (h *Handler) packageFiles() ([]string, string, error) {
	var candidates []string
	for _, format := range []string{"deb", "rpm"} {
		for _, arch := range []string{"amd64", "arm64"} {
			for _, name := range packageNames {
				candidates = append(candidates, format+"/"+arch+"/"+name+"."+format)
			}
		}
	}
	revs, err := h.revisions()
	if err != nil {
		return nil, "", err
	}
	for _, rev := range revs {
		for _, format := range []string{"deb", "rpm"} {
			for _, arch := range []string{"amd64", "arm64"} {
				candidates = append(candidates, "istio-sidecar/"+rev+"/"+format+"/"+arch+"/istio-sidecar."+format)
			}
		}
	}
	var files []string
	var state strings.Builder
	for _, c := range candidates {
		info, err := h.stat(c)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, "", fmt.Errorf("stat %s: %w", c, err)
		}
		if !info.Mode().IsRegular() {
			continue
		}
		files = append(files, c)
		v, _ := versionOf(info)
		fmt.Fprintf(&state, "%s %d %d %v\n", c, info.Size(), info.ModTime().UnixNano(), v)
	}
	return files, state.String(), nil
}

// revisions lists the istio-sidecar/<revision>/ directories of every
// directory (at most maxRevisions, in name order).
func (h *Handler) revisions() ([]string, error) {
	seen := map[string]bool{}
	var revs []string
	for _, r := range h.roots {
		names, err := revisionDirs(r)
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			if !seen[n] {
				seen[n] = true
				revs = append(revs, n)
			}
		}
	}
	sort.Strings(revs)
	if len(revs) > maxRevisions {
		h.log.Warn("local repository: too many revisions; indexing the first ones", "max", maxRevisions)
		revs = revs[:maxRevisions]
	}
	return revs, nil
}

// revisionDirs lists the istio-sidecar/<revision>/ directories of one
// directory (at most 4*maxRevisions entries are read).
func revisionDirs(r *os.Root) ([]string, error) {
	d, err := r.Open("istio-sidecar")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open istio-sidecar: %w", err)
	}
	defer func() { _ = d.Close() }()
	entries, err := d.ReadDir(4 * maxRevisions)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read istio-sidecar: %w", err)
	}
	var revs []string
	for _, e := range entries {
		if e.IsDir() && validRevision(e.Name()) {
			revs = append(revs, e.Name())
		}
	}
	return revs, nil
}

// describe returns the package file's facts and checksum, from the cache
// when the file's version is the one they were read from.
func (h *Handler) describe(name string) (*described, string, error) {
	f, err := h.open(name)
	if err != nil {
		return nil, "", err
	}
	defer func() { _ = f.Close() }()
	info, err := f.Stat()
	if err != nil {
		return nil, "", err
	}
	v, known := versionOf(info)
	h.mu.Lock()
	d, ok := h.sums[name]
	h.mu.Unlock()
	if ok && known && d.version == v && d.pkg != nil {
		return d.pkg, d.sum, nil
	}
	desc := &described{size: info.Size(), mtime: info.ModTime()}
	if strings.HasSuffix(name, ".deb") {
		c, err := debfile.Read(f)
		desc.deb, desc.err = &c, err
	} else {
		p, err := rpmfile.Read(f)
		desc.rpm, desc.err = &p, err
	}
	if desc.err == nil {
		desc.err = checkPackage(name, desc)
	}
	if desc.err != nil {
		h.log.Error("local repository: package left out of the metadata", "file", name, "error", desc.err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, "", err
	}
	sum, err := sha256Hex(f)
	if err != nil {
		return nil, "", err
	}
	h.mu.Lock()
	h.sums[name] = digest{version: v, sum: sum, pkg: desc}
	h.mu.Unlock()
	return desc, sum, nil
}

// checkPackage: the package's own name and architecture are the ones its
// path says.
func checkPackage(name string, d *described) error {
	seg := strings.Split(name, "/")
	arch := seg[len(seg)-2]
	pkg := strings.TrimSuffix(path.Base(name), path.Ext(name))
	if d.deb != nil {
		if got := d.deb.Get("Package"); got != pkg {
			return fmt.Errorf("package %q at the path of %s", got, pkg)
		}
		if got := d.deb.Get("Architecture"); got != arch && got != "all" {
			return fmt.Errorf("architecture %q at the path of %s", got, arch)
		}
		return nil
	}
	if d.rpm.Name != pkg {
		return fmt.Errorf("package %q at the path of %s", d.rpm.Name, pkg)
	}
	if d.rpm.Arch != archOfRPM[arch] && d.rpm.Arch != "noarch" {
		return fmt.Errorf("architecture %q at the path of %s (%s)", d.rpm.Arch, arch, archOfRPM[arch])
	}
	return nil
}

// generate builds and signs the metadata of files.
func (h *Handler) generate(files []string, state string, prev *snapshot) (*snapshot, error) {
	now := h.now().UTC().Truncate(time.Second)
	s := &snapshot{state: state, at: now, refreshAt: now.Add(h.validity / 2), files: map[string][]byte{}, old: map[string][]byte{}}
	if prev != nil {
		for k, v := range prev.files {
			if contentAddressed(k) {
				s.old[k] = v
			}
		}
	}
	suites := map[string]map[string][]metadata.DebEntry{StableSuite: {"amd64": nil, "arm64": nil}}
	yum := map[string][]metadata.RPMEntry{"rpm/": nil} // repository root (below /install/) -> packages
	agents := map[string][]metadata.DebEntry{}         // arch -> onboarding-agent DEBs
	for _, f := range files {
		d, sum, err := h.describe(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since it was listed: the next request sees a new state
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f, err)
		}
		if d.err != nil {
			continue
		}
		seg := strings.Split(f, "/")
		arch := seg[len(seg)-2]
		if d.deb != nil {
			e := metadata.DebEntry{Filename: f, Size: d.size, SHA256: sum, Control: *d.deb}
			suite := StableSuite
			if seg[0] == "istio-sidecar" {
				suite = RevisionSuitePrefix + seg[1]
			} else if seg[2] == "onboarding-agent.deb" {
				agents[arch] = append(agents[arch], e)
			}
			if suites[suite] == nil {
				suites[suite] = map[string][]metadata.DebEntry{"amd64": nil, "arm64": nil}
			}
			suites[suite][arch] = append(suites[suite][arch], e)
			continue
		}
		root := "rpm/"
		if seg[0] == "istio-sidecar" {
			root = "istio-sidecar/" + seg[1] + "/rpm/"
		}
		yum[root] = append(yum[root], metadata.RPMEntry{Href: strings.TrimPrefix(f, root), Size: d.size, SHA256: sum, MTime: d.mtime.Unix(), Package: *d.rpm})
	}
	// A revision's suite also has the agent.
	for suite, archs := range suites {
		if suite != StableSuite {
			for arch, entries := range agents {
				archs[arch] = append(archs[arch], entries...)
			}
		}
	}
	for name, pkgs := range suites {
		release, files := metadata.Apt(metadata.Suite{Name: name, Packages: pkgs, Date: now, ValidUntil: now.Add(h.validity)})
		dir := "dists/" + name + "/"
		inRelease, err := h.signer.ClearSign(release)
		if err != nil {
			return nil, err
		}
		sig, err := h.signer.DetachSign(release)
		if err != nil {
			return nil, err
		}
		s.files[dir+"Release"], s.files[dir+"InRelease"], s.files[dir+"Release.gpg"] = release, inRelease, sig
		for _, f := range files {
			s.files[dir+f.Path] = f.Data
			s.files[dir+path.Dir(f.Path)+"/by-hash/SHA256/"+metadata.SHA256(f.Data)] = f.Data
		}
	}
	for root, pkgs := range yum {
		repomd, files := metadata.Yum(pkgs, now.Unix())
		sig, err := h.signer.DetachSign(repomd)
		if err != nil {
			return nil, err
		}
		s.files[root+"repodata/repomd.xml"], s.files[root+"repodata/repomd.xml.asc"] = repomd, sig
		for _, f := range files {
			s.files[root+f.Path] = f.Data
		}
	}
	s.files[PublicKeysPath] = h.signer.PublicKeys()
	return s, nil
}

// contentAddressed: a path named by its content's hash, safe to serve after
// the index that names it is replaced.
func contentAddressed(p string) bool {
	if strings.Contains(p, "/by-hash/SHA256/") {
		return true
	}
	return strings.Contains(p, "repodata/") && strings.HasSuffix(p, ".xml.gz")
}
