package couplet

import (
	"io"
	"strings"
)

func stringsReader(lines []string) io.Reader { return strings.NewReader(strings.Join(lines, "\n")) }
