package sshkeys_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/apitest"
	"github.com/gantry-gpu/gantry/proto/api"
)

func TestAPISSHKeys(t *testing.T) {
	env := apitest.New(t)
	ctx := context.Background()
	_, root := env.PlatformAdmin(t)
	acme := env.NewTenant(t, root, "Acme")
	_, bobToken := env.NewUser(t, acme.AdminToken, "member")
	alice, bob := env.Client(acme.AdminToken), env.Client(bobToken)

	wantErr := func(status int, body []byte, got int, code, reason string) {
		t.Helper()
		var e api.ErrorResponse
		_ = json.Unmarshal(body, &e)
		if got != status || string(e.Code) != code || e.Details["reason"] != reason {
			t.Fatalf("got %d %s/%v, want %d %s/%s: %s", got, e.Code, e.Details["reason"], status, code, reason, body)
		}
	}

	line := ed25519Line(t, "alice@laptop")
	cr, err := alice.CreateSSHKeyWithResponse(ctx, &api.CreateSSHKeyParams{}, api.CreateSSHKeyJSONRequestBody{Name: "laptop", PublicKey: line})
	if err != nil {
		t.Fatal(err)
	}
	if cr.StatusCode() != 201 || cr.JSON201.KeyType != "ssh-ed25519" || *cr.JSON201.Bits != 256 {
		t.Fatalf("create: %d %s", cr.StatusCode(), cr.Body)
	}
	cr, err = alice.CreateSSHKeyWithResponse(ctx, &api.CreateSSHKeyParams{}, api.CreateSSHKeyJSONRequestBody{Name: "again", PublicKey: line})
	if err != nil {
		t.Fatal(err)
	}
	wantErr(409, cr.Body, cr.StatusCode(), "invalid_request", "duplicate_key")
	cr, err = alice.CreateSSHKeyWithResponse(ctx, &api.CreateSSHKeyParams{}, api.CreateSSHKeyJSONRequestBody{Name: "weak", PublicKey: rsaLine(t, 1024)})
	if err != nil {
		t.Fatal(err)
	}
	wantErr(422, cr.Body, cr.StatusCode(), "validation_error", "weak_key")

	ls, err := alice.ListSSHKeysWithResponse(ctx, &api.ListSSHKeysParams{})
	if err != nil {
		t.Fatal(err)
	}
	if ls.StatusCode() != 200 || len(ls.JSON200.Items) != 1 {
		t.Fatalf("list: %d %s", ls.StatusCode(), ls.Body)
	}
	id := ls.JSON200.Items[0].ID
	del, err := bob.DeleteSSHKeyWithResponse(ctx, id, &api.DeleteSSHKeyParams{})
	if err != nil {
		t.Fatal(err)
	}
	wantErr(404, del.Body, del.StatusCode(), "invalid_request", "not_found")
	del, err = alice.DeleteSSHKeyWithResponse(ctx, id, &api.DeleteSSHKeyParams{})
	if err != nil {
		t.Fatal(err)
	}
	if del.StatusCode() != 204 {
		t.Fatalf("delete: %d %s", del.StatusCode(), del.Body)
	}
	if env.Validated.Load() == 0 {
		t.Fatal("no response was validated against the contract")
	}
}
