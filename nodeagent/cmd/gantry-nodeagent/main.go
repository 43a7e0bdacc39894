// Command gantry-nodeagent is the Gantry node agent: it runs on every GPU host, dials
// out to the control plane's fabric and keeps one tunnel open (see docs/nodeagent.md).
//
//	gantry-nodeagent enroll --server https://cp.example --token <enrollment token>
//	gantry-nodeagent run
//	gantry-nodeagent gpu
package main

import (
	"fmt"
	"os"
)

// version is set at build time: -ldflags "-X main.version=1.2.3".
var version = "dev"

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "gantry-nodeagent:", err)
		os.Exit(1)
	}
}
