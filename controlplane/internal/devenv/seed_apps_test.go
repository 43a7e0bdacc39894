package devenv_test

import (
	"context"
	"os/exec"
	"slices"
	"testing"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps"
	"github.com/gantry-gpu/gantry/controlplane/internal/devenv"
	"github.com/gantry-gpu/gantry/shared/testenv"
)

// The dev catalog's apps exist after a seed, entitled to the demo tenant, runnable (their
// commands pass the catalog's checks), and a second seed changes nothing.
func TestSeedApps(t *testing.T) {
	pool := testenv.NewDatabase(t, template)
	ctx := context.Background()
	out := seed(t, pool, adminPW, demoPW)
	want := []string{devenv.DevFilesApp}
	if exec.Command("/usr/bin/python3", "-c", "import notebook, ipykernel").Run() == nil {
		want = append(want, devenv.DevJupyterApp)
	}
	for _, slug := range want {
		if !slices.Contains(out.Changes, "created app "+slug+" (entitled to every tenant)") {
			t.Errorf("first seed did not create %s: %v", slug, out.Changes)
		}
	}
	svc := apps.New(pool, nil, nil)
	list, _, err := svc.ListApps(ctx, out.TenantID, "", 50)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range list {
		if !a.Entitled || a.Latest() == "" {
			t.Errorf("%s: entitled %v, latest %q", a.Slug, a.Entitled, a.Latest())
		}
		got = append(got, a.Slug)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("apps %v, want %v", got, want)
	}
	v, err := svc.GetVersion(ctx, devenv.DevFilesApp, "1.0")
	if err != nil || v.Command[0] != "python3" || v.Health.Type != "http" {
		t.Fatalf("dev-files 1.0: %+v %v", v, err)
	}
	if again := seed(t, pool, adminPW, demoPW); len(again.Changes) != 0 {
		t.Fatalf("second seed changed %v", again.Changes)
	}
}
