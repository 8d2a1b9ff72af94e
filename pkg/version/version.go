// Package version reports the version of this shardd build.
package version

import "runtime/debug"

// Version is set at build time with
// -ldflags "-X github.com/shardd/shardd/pkg/version.Version=v1.2.3".
// When unset it is taken from the module build information.
var Version = ""

// String returns the build's version, "(devel)" when none is known.
func String() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
