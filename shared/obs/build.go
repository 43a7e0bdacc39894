package obs

import (
	"runtime/debug"
	"time"
)

// Build is a binary's build information: the version it was linked with, and the commit
// and commit time Go stamped from version control.
type Build struct {
	Version string
	// Commit is the VCS revision; "" when the build was not stamped (test binaries,
	// -buildvcs=false, builds outside a checkout).
	Commit string
	// Time is the commit's time; zero when not stamped.
	Time time.Time
}

// ReadBuild is this binary's build information. version is what the binary was linked
// with (-ldflags -X); the rest comes from runtime/debug, so every Gantry binary derives
// its commit the same way.
func ReadBuild(version string) Build {
	b := Build{Version: version}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Commit = s.Value
		case "vcs.time":
			if t, err := time.Parse(time.RFC3339, s.Value); err == nil {
				b.Time = t.UTC()
			}
		}
	}
	return b
}
