package cpu

import (
	"testing"

	"chunlian/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, SetGEMMPath) }
