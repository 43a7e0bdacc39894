package devenv

import (
	"context"
	"fmt"
	"os/exec"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/gantry-gpu/gantry/controlplane/internal/apps"
)

// The dev app catalog (docs/app-proxy.md): apps that really run on the dev node's agent
// with nothing but this machine's packages, entitled to every tenant, so that
// `make dev` can launch one on an allocation and open it through the app proxy.
const (
	// DevFilesApp serves the allocation's home directory (python3 -m http.server).
	DevFilesApp = "dev-files"
	// DevJupyterApp is a Jupyter Notebook; seeded only when the Debian package
	// python3-notebook is installed.
	DevJupyterApp = "jupyter"
	devAppVersion = "1.0"
)

// jupyterInstalled: the system python has the notebook and a kernel.
func jupyterInstalled() bool {
	return exec.Command("/usr/bin/python3", "-c", "import notebook, ipykernel").Run() == nil
}

func devApps(withJupyter bool) []apps.NewApp {
	out := []apps.NewApp{{
		Slug: DevFilesApp, Name: "Files", Kind: "app",
		Description: "The allocation's home directory in the browser (python3 -m http.server). Needs nothing but python3.",
		Versions: []apps.Version{{
			Version: devAppVersion, Port: 28080, Placement: apps.PlacementInstance,
			// {port} and {home} are expanded by the node agent (proto/fabric/apptask). The
			// proxy strips the instance prefix for an app that is not given {base_path}.
			Command: []string{"python3", "-m", "http.server", "{port}", "--bind", "127.0.0.1", "--directory", "{home}"},
			Health:  apps.HealthCheck{Type: "http", Path: "/", StartupTimeoutSeconds: 60},
		}},
	}}
	if withJupyter {
		out = append(out, apps.NewApp{
			Slug: DevJupyterApp, Name: "Jupyter Notebook", Kind: "jupyter",
			Description: "Jupyter Notebook 6 (Debian python3-notebook) in the allocation's home; authentication is the app proxy's.",
			Versions: []apps.Version{{
				Version: devAppVersion, Port: 28888, Placement: apps.PlacementInstance,
				// Served under its proxy path ({base_path}), so the proxy passes the whole
				// path. Jupyter's own token is off: only the proxy's users reach it.
				Command: []string{"/usr/bin/python3", "-m", "notebook", "--no-browser", "--ip=127.0.0.1", "--port={port}",
					"--NotebookApp.token=", "--NotebookApp.password=", "--NotebookApp.base_url={base_path}",
					"--NotebookApp.disable_check_xsrf=True", "--notebook-dir={home}", "--allow-root"},
				Health: apps.HealthCheck{Type: "tcp", StartupTimeoutSeconds: 120},
			}},
		})
	}
	return out
}

// seedApps creates the dev apps that are missing and entitles every tenant to them; it
// never changes apps that exist (an operator may have edited them).
func seedApps(ctx context.Context, pool *pgxpool.Pool, in SeedInput, s *Seeded) error {
	svc := apps.New(pool, in.Clock, in.IDs)
	for _, a := range devApps(jupyterInstalled()) {
		var exists bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM apps WHERE slug = $1)`, a.Slug).Scan(&exists); err != nil {
			return fmt.Errorf("dev app %s: %w", a.Slug, err)
		}
		if exists {
			continue
		}
		if _, err := svc.CreateApp(ctx, s.AdminID, a); err != nil {
			return fmt.Errorf("dev app %s: %w", a.Slug, err)
		}
		if _, err := svc.Entitle(ctx, s.AdminID, a.Slug, uuid.Nil); err != nil {
			return fmt.Errorf("dev app %s entitlement: %w", a.Slug, err)
		}
		s.Changes = append(s.Changes, "created app "+a.Slug+" (entitled to every tenant)")
	}
	return nil
}
