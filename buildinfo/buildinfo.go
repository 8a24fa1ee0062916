// Package buildinfo says what a chunlian binary is: its version, the commit
// and Go toolchain that built it, when, and which kernels and backends it
// can use on this machine. `chunlian version` prints it and the server
// exports it as the chunlian_build_info metric.
//
// Version, commit and date come from the linker (release builds set them
// with -ldflags -X, scripts/release.sh) and otherwise from the module and
// VCS stamps Go embeds in every build (debug.ReadBuildInfo), so a plain
// `go build` in a git checkout still names its commit.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"chunlian/cuda"
	"chunlian/kernels/cpu"
)

// Set by the linker, e.g.
//
//	-ldflags "-X chunlian/buildinfo.version=v1.2.0 -X chunlian/buildinfo.commit=abc123 -X chunlian/buildinfo.date=2026-12-04T10:00:00Z"
//
// Empty means: take it from debug.ReadBuildInfo.
var (
	version string
	commit  string
	date    string
)

// Info is the static description of the binary: it does not depend on the
// machine it runs on.
type Info struct {
	Version   string // release tag, "devel" for an untagged build
	Commit    string // VCS revision ("unknown" outside a checkout); "+dirty" when built from a modified tree
	GoVersion string // toolchain, e.g. go1.26.8
	BuildDate string // RFC 3339 UTC: the release's SOURCE_DATE_EPOCH, else the commit time, else "unknown"
	Platform  string // GOOS/GOARCH
}

// Read returns the binary's Info. It never fails: missing fields read
// "unknown" (or "devel" for the version).
func Read() Info {
	in := Info{Version: version, Commit: commit, BuildDate: date, GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		fromBuildInfo(&in, bi)
	}
	if in.Version == "" {
		in.Version = "devel"
	}
	if in.Commit == "" {
		in.Commit = "unknown"
	}
	if in.BuildDate == "" {
		in.BuildDate = "unknown"
	}
	return in
}

// fromBuildInfo fills the fields the linker left empty from Go's embedded
// module and VCS stamps.
func fromBuildInfo(in *Info, bi *debug.BuildInfo) {
	if in.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		in.Version = bi.Main.Version // `go install chunlian/cmd/chunlian@vX`
	}
	var rev, vcsTime string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			vcsTime = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if in.Commit == "" && rev != "" {
		in.Commit = rev
		if dirty {
			in.Commit += "+dirty"
		}
	}
	if in.BuildDate == "" {
		in.BuildDate = vcsTime
	}
}

// Capabilities is what this binary can run on this machine.
type Capabilities struct {
	// CPUKernels is the CPU kernel set chosen by feature detection, as
	// logged by `serve` (e.g. "gemm=openblas bf16=asm-avx512 int8=asm-avx512 elementwise=asm").
	CPUKernels string
	// CUDA is true when the CUDA backend can run here (driver, NVRTC and
	// cuBLAS load and at least one device is visible); CUDAReason says why
	// not otherwise. The backend is compiled into every linux and darwin
	// build (it loads the CUDA libraries at run time, no cgo).
	CUDA       bool
	CUDAReason string
}

// Probe detects the capabilities. It loads the CUDA driver when present
// (tens of milliseconds), so it is for `chunlian version`, not hot paths.
// cudaLibDir is --cuda-lib-dir ("" = the default search).
func Probe(cudaLibDir string) Capabilities {
	c := Capabilities{CPUKernels: cpu.Kernels()}
	ok, err := cuda.Available(cudaLibDir)
	c.CUDA = ok
	if !ok {
		c.CUDAReason = "no usable GPU"
		if err != nil {
			c.CUDAReason = strings.SplitN(err.Error(), "\n", 2)[0]
			if i := strings.Index(c.CUDAReason, " (tried"); i > 0 {
				c.CUDAReason = c.CUDAReason[:i] // the search path: --backend cuda prints it in full
			}
		}
	}
	return c
}

// String is the multi-line text `chunlian version` prints.
func (in Info) String() string {
	return fmt.Sprintf("chunlian %s\n  commit:     %s\n  built:      %s\n  go:         %s\n  platform:   %s\n",
		in.Version, in.Commit, in.BuildDate, in.GoVersion, in.Platform)
}

// String describes the capabilities in the same layout as Info.String.
func (c Capabilities) String() string {
	cudaLine := "usable"
	if !c.CUDA {
		cudaLine = "compiled in, not usable here (" + c.CUDAReason + ")"
	}
	return fmt.Sprintf("  backends:   cpu, cuda: %s\n  cpu kernels: %s\n", cudaLine, c.CPUKernels)
}

// Labels are the chunlian_build_info labels (Prometheus' convention for
// build metadata: a constant gauge of value 1 whose labels carry the data).
func (in Info) Labels() map[string]string {
	return map[string]string{
		"version":    in.Version,
		"revision":   in.Commit,
		"goversion":  in.GoVersion,
		"build_date": in.BuildDate,
		"platform":   in.Platform,
	}
}
