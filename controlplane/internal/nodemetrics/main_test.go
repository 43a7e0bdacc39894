package nodemetrics_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) { testenv.MainThen(m, func() error { return goleak.Find() }) }
