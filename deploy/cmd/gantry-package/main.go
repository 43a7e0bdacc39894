// Command gantry-package builds the node agent's Debian package (deploy/packaging):
//
//	go run ./deploy/cmd/gantry-package -version 1.2.3 -out bin/
//
// It compiles gantry-nodeagent from this repository (or packages -binary) and writes
// bin/gantry-nodeagent_<version>_<arch>.deb and its .sha256, which the control plane
// serves to cloud-init (GANTRY_NODEAGENT_PACKAGE, docs/maas-simulator.md).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/gantry-gpu/gantry/deploy/packaging"
)

func main() {
	var o packaging.Options
	var out string
	flag.StringVar(&o.Binary, "binary", "", "a gantry-nodeagent binary to package (default: build it from the repository)")
	flag.StringVar(&o.Version, "version", "0.0.0-dev", "package version (MAJOR.MINOR.PATCH[-pre])")
	flag.StringVar(&o.Arch, "arch", "amd64", "Debian architecture")
	flag.StringVar(&out, "out", "bin", "output directory")
	flag.Parse()
	if err := run(o, out); err != nil {
		fmt.Fprintln(os.Stderr, "gantry-package:", err)
		os.Exit(1)
	}
}

func run(o packaging.Options, out string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	if o.Binary == "" {
		root, err := packaging.RepoRoot(".")
		if err != nil {
			return err
		}
		tmp, err := os.MkdirTemp("", "gantry-package-bin-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		if o.Binary, err = packaging.BuildAgent(context.Background(), root, tmp, o.Version, o.Arch); err != nil {
			return err
		}
	}
	p, err := packaging.WriteFiles(o, out)
	if err != nil {
		return err
	}
	fmt.Println(p)
	return nil
}
