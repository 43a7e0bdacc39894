package objects_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/gantry-gpu/gantry/shared/testenv"
)

// TestMain fails the package when a test leaves a goroutine behind (an upload or a
// download not ended).
func TestMain(m *testing.M) { testenv.MainThen(m, func() error { return goleak.Find() }) }
