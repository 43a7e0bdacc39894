package api_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/proto/openapi"
)

// The spec embedded in the generated code must be the committed contract: a failure here
// means openapi.yaml changed without `make generate`.
func TestEmbeddedSpecMatchesContract(t *testing.T) {
	doc, err := openapi.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	embedded, err := api.GetSwagger()
	if err != nil {
		t.Fatal(err)
	}
	want, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(embedded)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatal("proto/api is stale: run `make generate` (go generate ./proto/...) and commit api.gen.go")
	}
}
