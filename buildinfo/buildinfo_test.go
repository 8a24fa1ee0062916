package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func stamps(mainVersion string, kv ...string) *debug.BuildInfo {
	bi := &debug.BuildInfo{Main: debug.Module{Path: "chunlian", Version: mainVersion}}
	for i := 0; i+1 < len(kv); i += 2 {
		bi.Settings = append(bi.Settings, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
	}
	return bi
}

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Info // what the linker set
		bi   *debug.BuildInfo
		want Info
	}{
		{"vcs stamps fill the gaps", Info{},
			stamps("(devel)", "vcs.revision", "abc123", "vcs.time", "2026-12-04T10:00:00Z", "vcs.modified", "false"),
			Info{Version: "", Commit: "abc123", BuildDate: "2026-12-04T10:00:00Z"}},
		{"a modified tree is marked", Info{},
			stamps("(devel)", "vcs.revision", "abc123", "vcs.modified", "true"),
			Info{Commit: "abc123+dirty"}},
		{"go install's module version", Info{}, stamps("v1.2.3"), Info{Version: "v1.2.3"}},
		{"the linker's values win", Info{Version: "v2.0.0", Commit: "fff", BuildDate: "2027-01-01T00:00:00Z"},
			stamps("v1.2.3", "vcs.revision", "abc123", "vcs.time", "2026-12-04T10:00:00Z"),
			Info{Version: "v2.0.0", Commit: "fff", BuildDate: "2027-01-01T00:00:00Z"}},
	} {
		got := tc.in
		fromBuildInfo(&got, tc.bi)
		if got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestReadDefaults(t *testing.T) {
	in := Read()
	if in.GoVersion != runtime.Version() || in.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("Read() = %+v: Go version or platform wrong", in)
	}
	for k, v := range in.Labels() {
		if v == "" {
			t.Errorf("label %s empty in %+v", k, in)
		}
	}
	if !strings.HasPrefix(in.String(), "chunlian "+in.Version+"\n") {
		t.Errorf("String() = %q", in.String())
	}
}

func TestProbeReportsKernels(t *testing.T) {
	c := Probe(t.TempDir()) // an empty dir first: still the default search after it
	if !strings.Contains(c.CPUKernels, "gemm=") {
		t.Errorf("CPUKernels = %q, want the kernels line", c.CPUKernels)
	}
	if !c.CUDA && c.CUDAReason == "" {
		t.Error("CUDA unusable but no reason given")
	}
	if s := c.String(); !strings.Contains(s, "cpu kernels: "+c.CPUKernels) {
		t.Errorf("String() = %q", s)
	}
}
