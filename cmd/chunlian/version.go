package main

// version.go: `chunlian version` and `chunlian --version`: what the binary
// is (buildinfo.Read) and what it can run here (buildinfo.Probe).

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"chunlian/buildinfo"
)

// newVersionCmd builds `chunlian version`.
func newVersionCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "version",
		Short: "print the version, commit, Go version, build date, kernels and backends",
		Long: `Print what this binary is (version, commit, Go version, build date, platform)
and what it can run on this machine (CPU kernels, whether the CUDA libraries load).`,
		Example: "  chunlian version\n  chunlian version --short\n  chunlian --version",
		Args:    noArgs,
	}
	short := cmd.Flags().Bool("short", false, "print the version only")
	libDir := cmd.Flags().String("cuda-lib-dir", "", "directory holding the CUDA libraries, searched first")
	cmd.RunE = func(*cobra.Command, []string) error {
		in := buildinfo.Read()
		if *short {
			fmt.Fprintln(stdout, in.Version)
			return nil
		}
		fmt.Fprint(stdout, in.String(), buildinfo.Probe(*libDir).String())
		return nil
	}
	return withEnv(cmd)
}
