package main

import (
	"github.com/spf13/pflag"
	"strings"
	"testing"
)

func TestNVMLIndex(t *testing.T) {
	for _, tc := range []struct {
		dev     int
		visible string
		want    int
	}{
		{0, "", 0},
		{3, "", 3},
		{0, "5", 5},
		{1, "4,6", 6},
		{1, " 4, 7 ", 7},
		{0, "GPU-1234abcd", 0}, // UUIDs: same order assumed
		{2, "1", 2},            // out of the list: cuda.New reports the bad ordinal
	} {
		if got := nvmlIndex(tc.dev, tc.visible); got != tc.want {
			t.Errorf("nvmlIndex(%d, %q) = %d, want %d", tc.dev, tc.visible, got, tc.want)
		}
	}
}

func TestDeviceFlag(t *testing.T) {
	// The CHUNLIAN_DEVICE binding is TestEveryFlagHasEnv's.
	for _, tc := range []struct {
		flag    string
		want    int
		wantErr bool
	}{
		{"", 0, false},
		{"3", 3, false},
		{"-1", 0, true},
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		var c stackConfig
		c.registerModel(fs)
		var args []string
		if tc.flag != "" {
			args = []string{"--device", tc.flag}
		}
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		err := c.Validate()
		if tc.wantErr {
			if err == nil || !strings.Contains(err.Error(), "--device") {
				t.Errorf("flag %q: %v, want an error naming --device", tc.flag, err)
			}
			continue
		}
		if err != nil || c.CUDA.Device != tc.want {
			t.Errorf("flag %q: device %d err %v, want %d", tc.flag, c.CUDA.Device, err, tc.want)
		}
	}
}
