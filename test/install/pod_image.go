//go:build install

package install

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
)

// imageConfig is what the kubelet takes from an image's config: the
// process defaults a container's own fields override.
type imageConfig struct {
	User       string   `json:"User"`
	Entrypoint []string `json:"Entrypoint"`
	Cmd        []string `json:"Cmd"`
	Env        []string `json:"Env"`
	WorkingDir string   `json:"WorkingDir"`
}

type ociDescriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Platform  *struct {
		Architecture string `json:"architecture"`
		OS           string `json:"os"`
	} `json:"platform,omitempty"`
}

type ociIndex struct {
	Manifests []ociDescriptor `json:"manifests"`
}

type ociManifest struct {
	Config ociDescriptor   `json:"config"`
	Layers []ociDescriptor `json:"layers"`
}

const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaLayerGz  = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// unpackImage finds the linux image of the host's architecture in the OCI
// layout dir (`make image`'s output directory, or its layout/), unpacks its
// layers in order into rootfs and returns its config. Layers of the
// image build have no whiteouts or links; an entry of another type is an
// error rather than a silently different filesystem.
func unpackImage(dir, rootfs string) (imageConfig, error) {
	if _, err := os.Stat(filepath.Join(dir, "layout", "index.json")); err == nil {
		dir = filepath.Join(dir, "layout")
	}
	m, err := findManifest(dir, runtime.GOARCH)
	if err != nil {
		return imageConfig{}, err
	}
	var cfg struct {
		Config imageConfig `json:"config"`
	}
	if err := readBlobJSON(dir, m.Config.Digest, &cfg); err != nil {
		return imageConfig{}, fmt.Errorf("image config: %w", err)
	}
	for _, l := range m.Layers {
		if l.MediaType != mediaLayerGz {
			return imageConfig{}, fmt.Errorf("layer %s: media type %s, want %s", l.Digest, l.MediaType, mediaLayerGz)
		}
		if err := unpackLayer(blobPath(dir, l.Digest), rootfs); err != nil {
			return imageConfig{}, fmt.Errorf("layer %s: %w", l.Digest, err)
		}
	}
	return cfg.Config, nil
}

// findManifest walks the index (and nested indexes) to the manifest of
// linux/arch.
func findManifest(dir, arch string) (ociManifest, error) {
	var idx ociIndex
	if err := readJSON(filepath.Join(dir, "index.json"), &idx); err != nil {
		return ociManifest{}, fmt.Errorf("image layout %s: %w", dir, err)
	}
	for len(idx.Manifests) > 0 {
		var next *ociIndex
		for _, d := range idx.Manifests {
			switch {
			case d.MediaType == mediaIndex:
				next = &ociIndex{}
				if err := readBlobJSON(dir, d.Digest, next); err != nil {
					return ociManifest{}, err
				}
			case d.MediaType == mediaManifest && d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == arch:
				var m ociManifest
				err := readBlobJSON(dir, d.Digest, &m)
				return m, err
			}
		}
		if next == nil {
			break
		}
		idx = *next
	}
	return ociManifest{}, fmt.Errorf("image layout %s: no linux/%s image", dir, arch)
}

func blobPath(dir, digest string) string {
	alg, hex, _ := strings.Cut(digest, ":")
	return filepath.Join(dir, "blobs", alg, hex)
}

func readBlobJSON(dir, digest string, v any) error { return readJSON(blobPath(dir, digest), v) }

func readJSON(name string, v any) error {
	data, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func unpackLayer(blob, rootfs string) error {
	f, err := os.Open(blob)
	if err != nil {
		return err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := unpackEntry(tr, h, rootfs); err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
	}
}

func unpackEntry(r io.Reader, h *tar.Header, rootfs string) error {
	name := path.Clean("/" + h.Name)
	if strings.HasPrefix(path.Base(name), ".wh.") {
		return errors.New("whiteout entries are not supported")
	}
	p := filepath.Join(rootfs, filepath.FromSlash(name))
	mode := os.FileMode(h.Mode).Perm()
	if h.Mode&0o1000 != 0 {
		mode |= os.ModeSticky
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	case tar.TypeReg:
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		out, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, r); err != nil {
			out.Close()
			return err
		}
		if err := out.Close(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("tar entry type %c is not supported", h.Typeflag)
	}
	if err := os.Chmod(p, mode); err != nil {
		return err
	}
	return os.Lchown(p, h.Uid, h.Gid)
}
