package build

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// file is one entry of a layer; parents are added as root-owned 0755
// directories.
type file struct {
	name string // absolute path in the image
	dir  bool
	mode int64
	uid  int
	data []byte
}

// tarFiles writes files and their parent directories, sorted by name, owned
// by root unless said otherwise, every time created.
func tarFiles(files []file, created time.Time) ([]byte, error) {
	entries := map[string]file{}
	for _, f := range files {
		name := strings.TrimPrefix(path.Clean(f.name), "/")
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = file{name: d, dir: true, mode: 0o755}
			}
		}
		f.name = name
		entries[name] = f
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		f := entries[n]
		h := &tar.Header{Name: n, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: created, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag, h.Name = tar.TypeDir, n+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("tar %s: %w", n, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("tar %s: %w", n, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close tar: %w", err)
	}
	return buf.Bytes(), nil
}

// tarDir writes the directory dir (an OCI layout) to the tar file out, its
// entries sorted and every time created: an OCI archive.
func tarDir(dir, out string, created time.Time) error {
	var files []file
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			files = append(files, file{name: filepath.ToSlash(rel), dir: true, mode: 0o755})
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files = append(files, file{name: filepath.ToSlash(rel), mode: 0o644, data: data})
		return nil
	})
	if err != nil {
		return fmt.Errorf("read OCI layout: %w", err)
	}
	data, err := tarFiles(files, created)
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, data, 0o644); err != nil {
		return fmt.Errorf("write OCI archive: %w", err)
	}
	return nil
}
