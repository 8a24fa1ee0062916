package cpu

import "runtime"

const isDarwin = runtime.GOOS == "darwin"
