// Command chunlian is the whole product in one binary. main only wires the
// domain packages together; each subcommand lives in its own file and
// registers itself in commands.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
)

// command is one subcommand: run gets the arguments after its name.
type command struct {
	summary string
	run     func(args []string) error
}

// commands is filled by init functions in serve.go, generate.go, bench.go, …
var commands = map[string]command{}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: chunlian <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(os.Stderr, "\nRun 'chunlian <command> -h' for a command's flags.")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	if os.Args[1] == "--version" || os.Args[1] == "-version" {
		os.Args[1] = "version"
	}
	c, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "chunlian: unknown command %q\n\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	err := c.run(os.Args[2:])
	if errors.Is(err, flag.ErrHelp) {
		return // -h: the flag set has printed the usage
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "chunlian %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
