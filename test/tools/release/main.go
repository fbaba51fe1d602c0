// Command release writes Embark's release directory from the outputs of
// `make image` and `make packages` (nothing is rebuilt): the Helm chart
// package, the image archive, the agent's DEB/RPM packages, SPDX SBOMs,
// SHA256SUMS and a cosign-format signature of each. `make release` runs it;
// docs/install.md says how to verify a release.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/embark-mesh/embark/test/tools/release/assemble"
	"github.com/embark-mesh/embark/test/tools/release/sign"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "release: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var opts assemble.Options
	var arches, epoch, out, key, throwawayKey string
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	fs.StringVar(&opts.Version, "version", "", "release version, e.g. v0.2.0 (required)")
	fs.StringVar(&opts.Revision, "revision", "", "source commit")
	fs.StringVar(&opts.Source, "source", "https://github.com/embark-mesh/embark", "source repository URL")
	fs.StringVar(&opts.ChartDir, "chart", "manifests/charts/embark", "Helm chart directory")
	fs.StringVar(&opts.ImageDir, "image-dir", "_output/image", "make image's output directory")
	fs.StringVar(&opts.ImageName, "image-name", "embark-mesh/onboarding-endpoint", "image repository name")
	fs.StringVar(&opts.PackagesDir, "packages-dir", "_output/packages", "make packages' output directory")
	fs.StringVar(&opts.PackagesSigningKey, "packages-signing-key", "", "armored OpenPGP private key the packages were signed with (make packages' signing key); its public key is published")
	fs.StringVar(&opts.BinDir, "bin-dir", "_output/bin", "directory of linux_<arch>/onboarding-agent, the binaries the packages ship")
	fs.StringVar(&arches, "arches", "amd64 arm64", "package architectures, separated by spaces or commas")
	fs.StringVar(&epoch, "source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"), "SBOM creation time in Unix seconds (default $SOURCE_DATE_EPOCH)")
	fs.StringVar(&key, "key", "", "signing key: cosign-format (password in $COSIGN_PASSWORD) or PEM EC P-256 private key file")
	fs.StringVar(&throwawayKey, "throwaway-key", "", "without -key: sign with the unencrypted key in this file, generated when missing")
	fs.StringVar(&out, "o", "", "release directory, emptied first (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if out == "" {
		return fmt.Errorf("-o is required")
	}
	secs, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		return fmt.Errorf("source date epoch %q: %w", epoch, err)
	}
	opts.Created = time.Unix(secs, 0).UTC()
	opts.Arches = strings.FieldsFunc(arches, func(r rune) bool { return r == ',' || r == ' ' })
	if opts.Signer, err = signer(key, throwawayKey); err != nil {
		return err
	}
	signed, err := assemble.Assemble(opts, out)
	if err != nil {
		return err
	}
	fmt.Printf("release %s in %s: %d files signed, public key %s\n", opts.Version, out, len(signed), assemble.PublicKeyFile)
	for _, name := range signed {
		fmt.Printf("  %s\n", name)
	}
	return nil
}

// signer loads the release key, or the throwaway key, saying so loudly.
func signer(key, throwaway string) (*sign.Signer, error) {
	if key != "" {
		return sign.LoadKey(key, []byte(os.Getenv("COSIGN_PASSWORD")))
	}
	if throwaway == "" {
		return nil, fmt.Errorf("-key or -throwaway-key is required")
	}
	s, generated, err := sign.LoadOrGenerateKey(throwaway)
	if err != nil {
		return nil, err
	}
	verb := "reusing"
	if generated {
		verb = "generated"
	}
	fmt.Fprintf(os.Stderr, "release: WARNING: no release signing key: signing with a THROWAWAY key (%s %s); its signatures prove nothing to anyone else\n", verb, throwaway)
	return s, nil
}
