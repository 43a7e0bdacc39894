package observability

import (
	"runtime/debug"
	"sync"

	"github.com/gantry-gpu/gantry/deploy"
)

// BuildCommit is the VCS revision the binary was built from ("" when the build was
// not stamped, e.g. with -buildvcs=false).
func BuildCommit() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	return ""
}

var deployManifest = sync.OnceValue(func() *Manifest {
	m, err := LoadManifest(deploy.Monitoring)
	if err != nil {
		// The embedded files are checked by this package's tests; a binary built
		// from files that fail them is a build error, not a runtime condition.
		panic("observability: embedded deploy manifest: " + err.Error())
	}
	return m
})

// DeployManifest is the manifest of the embedded deploy files, loaded once.
func DeployManifest() *Manifest { return deployManifest() }
