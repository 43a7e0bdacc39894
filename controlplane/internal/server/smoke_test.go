package server_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/proto/api"
)

func TestSmokeTenantAndProject(t *testing.T) {
	e := apitest.New(t)
	_, adminTok := e.PlatformAdmin(t)
	ten := e.NewTenant(t, adminTok, "Acme")
	resp, err := e.Client(ten.AdminToken).GetProjectWithResponse(context.Background(), ten.DefaultProject, &api.GetProjectParams{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode() != http.StatusOK || resp.JSON200.ID != ten.DefaultProject {
		t.Fatalf("get project: %d %s", resp.StatusCode(), resp.Body)
	}
	if e.Validated.Load() < 3 {
		t.Fatalf("only %d responses validated", e.Validated.Load())
	}
}
