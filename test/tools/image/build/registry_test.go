package build

import (
	"io"
	"log"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestPushKeepsDigest pushes the OCI layout into a registry as `crane push
// _output/image/layout REF` does (the layout's one index.json entry, through
// go-containerregistry's remote package) and reads it back by tag: the
// registry serves the digest the build wrote. The registry is
// go-containerregistry's in-memory implementation of the OCI distribution
// API on loopback; no registry is reachable from here.
func TestPushKeepsDigest(t *testing.T) {
	b := buildOnce(t)
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)

	top, err := layout.ImageIndexFromPath(filepath.Join(b.dir, LayoutDir))
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(strings.TrimPrefix(srv.URL, "http://")+"/embark/onboarding-endpoint:"+b.opts.Version, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx, remote.WithContext(t.Context())); err != nil {
		t.Fatalf("push: %v", err)
	}
	desc, err := remote.Get(ref, remote.WithContext(t.Context()))
	if err != nil {
		t.Fatalf("pull: %v", err)
	}
	want := strings.TrimSpace(string(mustRead(t, filepath.Join(b.dir, DigestFile))))
	if desc.Digest.String() != want {
		t.Errorf("registry serves %s for %s, the build wrote %s", desc.Digest, ref, want)
	}
	pulled, err := desc.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := pulled.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range im.Manifests {
		img, err := pulled.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		// Every blob came across: the layers read back with their digests.
		layers, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range layers {
			if _, err := l.Compressed(); err != nil {
				t.Errorf("%s: layer: %v", m.Platform, err)
			}
		}
	}
}
