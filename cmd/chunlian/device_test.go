package main

import (
	"flag"
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
	for _, tc := range []struct {
		env, flag string
		want      int
		wantErr   bool
	}{
		{"", "", 0, false},
		{"2", "", 2, false},
		{"2", "3", 3, false},
		{"x", "", 0, true},
		{"", "-1", 0, true},
	} {
		if tc.env != "" {
			t.Setenv("CHUNLIAN_DEVICE", tc.env)
		}
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		var c stackConfig
		c.register(fs)
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
				t.Errorf("env %q flag %q: %v, want an error naming --device", tc.env, tc.flag, err)
			}
			continue
		}
		if err != nil || c.CUDA.Device != tc.want {
			t.Errorf("env %q flag %q: device %d err %v, want %d", tc.env, tc.flag, c.CUDA.Device, err, tc.want)
		}
	}
}
