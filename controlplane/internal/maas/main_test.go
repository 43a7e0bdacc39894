package maas_test

import (
	"os"
	"testing"

	"github.com/gantry-gpu/gantry/shared/testenv"
)

func TestMain(m *testing.M) {
	// Re-executed by TestSIGKILLInEachStepResumes as a control-plane replica.
	if os.Getenv(replicaEnv) != "" {
		os.Exit(runReplica())
	}
	testenv.Main(m)
}
