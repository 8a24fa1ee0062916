package sampler

import (
	"testing"

	"chunlian/internal/testenv"
	"chunlian/kernels/cpu"
)

func TestMain(m *testing.M) { testenv.Main(m, cpu.SetGEMMPath) }
