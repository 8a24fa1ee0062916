package main

// experimental.go: --experimental=a,b (Prometheus' --enable-feature style),
// the one switch for behaviour that is useful but not the default. A name
// not in featureDocs is an error that lists the known ones.

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// The experimental features.
const (
	// featCPUInt8 runs the CPU backend's GEMMs of 1..256 rows on int8
	// copies of the weights (per-row scales): faster decode, logits that
	// differ from bf16 (forward.CPUOptions.Int8; docs/DECISIONS.md).
	featCPUInt8 = "cpu-int8"
)

// featureDocs describes every known feature (help text and validation).
var featureDocs = map[string]string{
	featCPUInt8: "CPU backend: small-batch GEMMs on int8 weight copies (faster decode, logits differ from bf16)",
}

// knownFeatures lists the feature names for help and errors.
func knownFeatures() string {
	names := make([]string, 0, len(featureDocs))
	for n, d := range featureDocs {
		names = append(names, n+" ("+d+")")
	}
	sort.Strings(names)
	return strings.Join(names, "; ")
}

// features is the pflag.Value of --experimental: a validated set of names.
// Repeating the flag adds to the set.
type features []string

func (f *features) String() string { return strings.Join(*f, ",") }

// Type names the value in help.
func (f *features) Type() string { return "names" }

// Set adds the comma-separated names in s; an unknown name is an error.
func (f *features) Set(s string) error {
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if _, ok := featureDocs[n]; !ok {
			return fmt.Errorf("unknown experimental feature %q (known: %s)", n, knownFeatures())
		}
		if !slices.Contains(*f, n) {
			*f = append(*f, n)
		}
	}
	return nil
}

// Has reports whether feature name is on.
func (f features) Has(name string) bool { return slices.Contains(f, name) }
