// Command chunlian is the whole product in one binary. main only wires the
// domain packages together; each subcommand lives in its own file, except
// `version`, a few lines at the end of this one.
//
// The command line is built on spf13/cobra and spf13/pflag: flags may come
// before or after positional arguments, every subcommand has its own
// synopsis and help, and `chunlian completion bash|zsh|fish|powershell`
// prints a shell completion script.
//
// Every flag of every command can also be set from the environment: flag
// --foo-bar ↔ CHUNLIAN_FOO_BAR (envName). Precedence: flag > env >
// built-in default. bindEnv applies the rule; TestEveryFlagHasEnv checks it
// on the whole command tree.
//
// Adding a subcommand: write newXxxCmd() *cobra.Command in its own file and
// add it to subcommands below (or, for a command that parses its own
// arguments, register a command{summary, run} in commands from an init
// function).
package main

import (
	"chunlian/buildinfo"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// command is a subcommand that parses its own arguments: run gets the
// arguments after its name, unparsed (no env binding: it has no flags that
// cobra knows of).
type command struct {
	summary string
	run     func(args []string) error
}

// commands holds the self-parsing subcommands, filled by init functions.
var commands = map[string]command{}

// subcommands lists the constructors of the cobra subcommands; stdout is
// where their results go (tests pass a buffer).
func subcommands(stdout io.Writer) []*cobra.Command {
	return []*cobra.Command{
		newServeCmd(nil, nil),
		newGenerateCmd(stdout),
		newEvalCmd(stdout),
		newBenchCmd(stdout),
		newVersionCmd(stdout),
	}
}

// newRoot builds the whole command tree.
func newRoot(stdout io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "chunlian",
		Short: "Spring Festival couplets (春联) on a vLLM-style inference engine",
		Long: "chunlian writes Spring Festival couplets (春联) on its own inference engine.\n\n" +
			"Every flag can also be set from the environment: flag --foo-bar is CHUNLIAN_FOO_BAR\n" +
			"(precedence: flag > environment > default).",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.Version = buildinfo.Read().Version // --version
	root.SetVersionTemplate("{{.Version}}\n")
	for _, c := range subcommands(stdout) {
		root.AddCommand(c)
	}
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c := commands[n]
		root.AddCommand(&cobra.Command{
			Use: n, Short: c.summary, DisableFlagParsing: true,
			RunE: func(_ *cobra.Command, args []string) error { return c.run(args) },
		})
	}
	return root
}

// envPrefix starts every environment variable of the command line.
const envPrefix = "CHUNLIAN_"

// envName is the environment variable of flag name: --foo-bar ↔
// CHUNLIAN_FOO_BAR.
func envName(flag string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// bindEnv sets every flag of fs that was not given on the command line
// from its CHUNLIAN_* variable, if that is set. A malformed value is an
// error naming the variable; all of them are reported at once.
func bindEnv(fs *pflag.FlagSet) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || f.Name == "help" {
			return
		}
		name := envName(f.Name)
		v, ok := os.LookupEnv(name)
		if !ok {
			return
		}
		// fs.Set marks the flag changed, as if given on the command line.
		if err := fs.Set(f.Name, strings.TrimSpace(v)); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q (flag --%s): %v", name, v, f.Name, err))
		}
	})
	return errors.Join(errs...)
}

// withEnv makes cmd bind its flags to the environment before it runs and
// adds the env rule to its help.
func withEnv(cmd *cobra.Command) *cobra.Command {
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	cmd.PreRunE = func(c *cobra.Command, _ []string) error { return bindEnv(c.Flags()) }
	cmd.Long = strings.TrimSpace(cmd.Long) + "\n\nEvery flag --foo-bar can also be set as CHUNLIAN_FOO_BAR (the flag wins)."
	return cmd
}

// execute runs cmd alone on args (tests and the run* wrappers).
func execute(cmd *cobra.Command, args []string) error {
	cmd.SetArgs(args)
	if args == nil {
		cmd.SetArgs([]string{})
	}
	return cmd.Execute()
}

func main() {
	root := newRoot(os.Stdout)
	c, err := root.ExecuteC()
	if err != nil {
		name := "chunlian"
		if c != nil && c != root {
			name = c.CommandPath()
		}
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		if c != nil && isUsageError(err) {
			fmt.Fprintf(os.Stderr, "Run '%s -h' for help.\n", c.CommandPath())
		}
		os.Exit(1)
	}
}

// isUsageError reports whether err is about the command line itself
// (unknown flag or command, wrong arguments) rather than about running.
func isUsageError(err error) bool {
	var u usageError
	if errors.As(err, &u) {
		return true
	}
	s := err.Error()
	return strings.HasPrefix(s, "unknown ") || strings.Contains(s, "flag needs an argument") ||
		strings.HasPrefix(s, "invalid argument")
}

// usageError is a wrong command line (e.g. a missing positional argument).
type usageError struct{ msg string }

func (u usageError) Error() string { return u.msg }

// exactArgs accepts exactly n positional arguments, named what in the
// error.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError{fmt.Sprintf("need exactly %d %s argument(s), got %d %q", n, what, len(args), args)}
		}
		return nil
	}
}

// noArgs rejects positional arguments (all options are flags).
func noArgs(_ *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Sprintf("unexpected arguments %q (all options are flags)", args)}
	}
	return nil
}

// newVersionCmd builds `chunlian version` (also `chunlian --version`):
// what the binary is (buildinfo.Read) and what it can run here
// (buildinfo.Probe).
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
