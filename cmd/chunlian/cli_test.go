package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// envSample returns a value that f's type parses and that differs from
// its default, for the env-binding walk.
func envSample(t *testing.T, f *pflag.Flag) string {
	switch f.Value.Type() {
	case "bool":
		if f.DefValue == "true" {
			return "false"
		}
		return "true"
	case "int", "uint64", "bytes":
		if f.DefValue == "7" {
			return "8"
		}
		return "7"
	case "float64":
		return "0.25"
	case "duration":
		return "7s"
	case "string":
		return "env-value"
	case "names":
		return featCPUInt8
	}
	t.Fatalf("--%s: no sample for type %q: extend envSample", f.Name, f.Value.Type())
	return ""
}

// TestEveryFlagHasEnv walks every flag of every command: CHUNLIAN_FOO_BAR
// sets --foo-bar when the flag is not given, and the flag wins when it is.
func TestEveryFlagHasEnv(t *testing.T) {
	checked := 0
	for _, cmd := range newRoot(io.Discard).Commands() {
		if cmd.DisableFlagParsing || cmd.Name() == "completion" || cmd.Name() == "help" {
			continue
		}
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Name == "help" {
				return
			}
			t.Run(cmd.Name()+"/"+f.Name, func(t *testing.T) {
				// A fresh command each time: flags keep their values.
				fresh := findCmd(t, cmd.Name())
				ff := fresh.Flags().Lookup(f.Name)
				v := envSample(t, ff)
				t.Setenv(envName(f.Name), v)
				if err := bindEnv(fresh.Flags()); err != nil {
					t.Fatal(err)
				}
				if got := ff.Value.String(); got == ff.DefValue || !ff.Changed {
					t.Errorf("%s=%s: --%s = %q (default %q), not set from the environment", envName(f.Name), v, f.Name, got, ff.DefValue)
				}
				// The flag wins over the environment.
				again := findCmd(t, cmd.Name())
				fa := again.Flags().Lookup(f.Name)
				if err := again.Flags().Set(f.Name, fa.DefValue); err != nil && fa.DefValue != "" {
					t.Fatal(err)
				}
				if err := bindEnv(again.Flags()); err != nil {
					t.Fatal(err)
				}
				if fa.Changed && fa.Value.String() != fa.DefValue && fa.DefValue != "" {
					t.Errorf("--%s given: the environment overrode it (%q)", f.Name, fa.Value.String())
				}
			})
			checked++
		})
	}
	if checked < 40 {
		t.Errorf("walked only %d flags", checked)
	}
}

// findCmd builds a fresh, parentless subcommand name.
func findCmd(t *testing.T, name string) *cobra.Command {
	t.Helper()
	for _, c := range subcommands(io.Discard) {
		if c.Name() == name {
			return c
		}
	}
	t.Fatalf("no command %q", name)
	return nil
}

// A malformed environment value is an error naming the variable.
func TestBadEnvNamesVariable(t *testing.T) {
	t.Setenv("CHUNLIAN_N", "three")
	err := runGenerate([]string{"--random-model", "平安"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "CHUNLIAN_N") {
		t.Errorf("error %v, want one naming CHUNLIAN_N", err)
	}
}

// Each command has a synopsis and its own help; generate's help lists the
// generation and model flags, not the server's or the GPU tuning ones.
func TestCommandHelp(t *testing.T) {
	for _, cmd := range newRoot(io.Discard).Commands() {
		if cmd.Name() == "completion" || cmd.Name() == "help" || cmd.DisableFlagParsing {
			continue
		}
		var out bytes.Buffer
		c := findCmd(t, cmd.Name())
		c.SetOut(&out)
		if err := execute(c, []string{"-h"}); err != nil {
			t.Fatalf("%s -h: %v", cmd.Name(), err)
		}
		h := out.String()
		if c.Short == "" || !strings.Contains(h, "Usage:") || !strings.Contains(h, "CHUNLIAN_FOO_BAR") {
			t.Errorf("%s -h lacks a synopsis, usage or the env rule:\n%s", cmd.Name(), h)
		}
		if cmd.Name() != "generate" {
			continue
		}
		for _, want := range []string{"--n ", "--temperature", "--model", "--backend", "--json"} {
			if !strings.Contains(h, want) {
				t.Errorf("generate -h lacks %s", want)
			}
		}
		for _, not := range []string{"--addr", "--api-key", "--max-num-seqs", "--gpu-memory-utilization", "--drain-timeout", "--block-size"} {
			if strings.Contains(h, not) {
				t.Errorf("generate -h lists the server flag %s", not)
			}
		}
	}
}

// Flags may follow the text; temperature 0 is greedy on the command line
// as over HTTP (the same couplets for two seeds); limits are the shared
// ones.
func TestGenerateFlagsAfterText(t *testing.T) {
	var out bytes.Buffer
	if err := runGenerate([]string{"平安", "--random-model", "--n", "2", "--json", "--threads", "1"}, &out); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(out.String(), "\n"); got != 2 {
		t.Errorf("--n 2 after the text: %d lines:\n%s", got, out.String())
	}
	greedy := func(seed string) string {
		var b bytes.Buffer
		if err := runGenerate([]string{"平安", "--random-model", "--temperature", "0", "--seed", seed, "--banner-candidates", "0"}, &b); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	if a, b := greedy("1"), greedy("2"); a != b {
		t.Errorf("--temperature 0 is not greedy: seed 1 %q, seed 2 %q", a, b)
	}
	for _, args := range [][]string{{"--n", "11"}, {"--temperature", "2.5"}, {"--length", "29"}, {"--temperature", "-1"}} {
		err := runGenerate(append([]string{"平安", "--random-model"}, args...), io.Discard)
		if err == nil {
			t.Errorf("%v: accepted beyond the shared limits", args)
		}
	}
	if err := runGenerate([]string{"--random-model"}, io.Discard); err == nil || !strings.Contains(err.Error(), "TEXT") {
		t.Errorf("no TEXT: %v, want an error naming TEXT", err)
	}
}

// --explain prints, after the couplet, every ranked candidate with its
// features, exactly one of them chosen: the returned couplet.
func TestGenerateExplain(t *testing.T) {
	var out bytes.Buffer
	if err := runGenerate([]string{"平安", "--random-model", "--json", "--explain", "--seed", "4", "--threads", "1"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var first jsonCouplet
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil || first.Upper == "" {
		t.Fatalf("first line %q: %v", lines[0], err)
	}
	chosen := 0
	for _, l := range lines[1:] {
		var c jsonCandidate
		if err := json.Unmarshal([]byte(l), &c); err != nil || c.Candidate == "" || c.Features.LogProb >= 0 {
			t.Fatalf("candidate line %q: %v", l, err)
		}
		if c.Chosen {
			chosen++
			if c.Candidate != first.Upper+" / "+first.Lower {
				t.Errorf("chosen candidate %q, couplet %s / %s", c.Candidate, first.Upper, first.Lower)
			}
		}
	}
	if len(lines) < 2 || chosen != 1 {
		t.Errorf("%d candidate lines, %d chosen; want some, one chosen:\n%s", len(lines)-1, chosen, out.String())
	}
}

// bench --url against a closed port fails at once with an error naming
// the address, and writes no report.
func TestBenchDeadURLFailsFast(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // the port is now closed
	var out bytes.Buffer
	err = runBench([]string{"--url", "http://" + addr, "--quiet", "--duration", "1s", "--warmup", "0s", "--concurrency", "1"}, &out)
	if err == nil || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "not reachable") {
		t.Errorf("bench on a closed port: %v, want a 'not reachable' error naming %s", err, addr)
	}
	if out.Len() != 0 {
		t.Errorf("a report was written for an unreachable target:\n%s", out.String())
	}
}
