package api_test

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/proto/openapi"
)

// The generated code must come from the committed contract: a failure here means
// openapi.yaml changed without `make generate`.
func TestGeneratedFromTheCommittedContract(t *testing.T) {
	sum := sha256.Sum256(openapi.Document)
	if got := hex.EncodeToString(sum[:]); got != api.SpecSHA256 {
		t.Fatalf("proto/api was generated from openapi.yaml %s, the committed one is %s: run `make generate` (go generate ./proto/...) and commit", api.SpecSHA256, got)
	}
}
