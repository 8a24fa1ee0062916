package main

// version.go: `chunlian version` and `chunlian --version`: what the binary
// is (buildinfo.Read) and what it can run here (buildinfo.Probe).

import (
	"flag"
	"fmt"
	"os"

	"chunlian/buildinfo"
	"chunlian/cuda"
)

func init() {
	commands["version"] = command{
		summary: "print the version, commit, Go version, build date, kernels and backends",
		run:     versionMain,
	}
}

func versionMain(args []string) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	short := fs.Bool("short", false, "print the version only")
	libDir := fs.String("cuda-lib-dir", os.Getenv(cuda.EnvLibDir), "directory holding the CUDA libraries, searched first ["+cuda.EnvLibDir+"]")
	if err := fs.Parse(args); err != nil {
		return err
	}
	in := buildinfo.Read()
	if *short {
		fmt.Println(in.Version)
		return nil
	}
	fmt.Print(in.String(), buildinfo.Probe(*libDir).String())
	return nil
}
