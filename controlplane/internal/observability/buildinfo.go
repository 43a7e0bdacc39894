package observability

import (
	"sync"

	"github.com/gantry-gpu/gantry/deploy"
	"github.com/gantry-gpu/gantry/shared/obs"
)

// BuildCommit is the VCS revision the binary was built from ("" when the build was
// not stamped, e.g. with -buildvcs=false).
func BuildCommit() string { return obs.ReadBuild("").Commit }

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
