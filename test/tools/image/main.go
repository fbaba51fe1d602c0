// Command image builds Embark's onboarding-endpoint container image (a
// multi-platform OCI image index) into an OCI layout and archive without a
// container daemon or a registry. `make image` runs it; see
// docs/install.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/embark-mesh/embark/test/tools/image/build"
)

func main() {
	var opts build.Options
	var platforms, epoch, out string
	flag.StringVar(&opts.ModuleDir, "module-dir", ".", "Go module to build from")
	flag.StringVar(&opts.Package, "package", "./cmd/onboarding-endpoint", "main package (the entrypoint)")
	flag.StringVar(&platforms, "platforms", "linux/amd64,linux/arm64", "comma-separated platforms")
	flag.StringVar(&opts.LDFlags, "ldflags", "", `linker flags added to "-s -w" (version stamps)`)
	flag.StringVar(&opts.Name, "name", "embark-mesh/onboarding-endpoint", "image repository name")
	flag.StringVar(&opts.Version, "version", "", "release version, the layout's tag (required)")
	flag.StringVar(&opts.Revision, "revision", "", "source commit (required)")
	flag.StringVar(&opts.Source, "source", "https://github.com/embark-mesh/embark", "source repository URL")
	flag.StringVar(&opts.Licenses, "licenses", "Apache-2.0", "SPDX license expression")
	flag.StringVar(&opts.LicenseFile, "license-file", "", "license text copied into the image (optional)")
	flag.StringVar(&opts.PackagesDir, "packages", "", "the output directory of make packages: its onboarding-agent DEB and RPM files (amd64, arm64) go into the image at "+build.RepositoryDir+" (optional)")
	flag.StringVar(&epoch, "source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"), "every timestamp in the image, in Unix seconds (default $SOURCE_DATE_EPOCH)")
	flag.StringVar(&out, "o", "_output/image", "output directory")
	flag.Parse()
	if epoch == "" {
		fail(fmt.Errorf("-source-date-epoch or SOURCE_DATE_EPOCH is required"))
	}
	secs, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		fail(fmt.Errorf("source date epoch %q: %w", epoch, err))
	}
	opts.Created = time.Unix(secs, 0).UTC()
	opts.Platforms = strings.Split(platforms, ",")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := build.Build(ctx, opts, out)
	if err != nil {
		fail(err)
	}
	fmt.Printf("%s:%s %s\n", opts.Name, opts.Version, res.Digest)
	for _, img := range res.Images {
		fmt.Printf("  %s/%s %s %d bytes, SBOM %s\n", img.Platform.OS, img.Platform.Architecture, img.Digest, img.Size, img.SBOM)
	}
	fmt.Printf("  OCI layout %s, OCI archive %s\n", res.Layout, res.Archive)
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "image: %v\n", err)
	os.Exit(1)
}
