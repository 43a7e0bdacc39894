package command

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/gantry-gpu/gantry/cli/internal/apiclient"
	"github.com/gantry-gpu/gantry/cli/internal/output"
	"github.com/gantry-gpu/gantry/proto/api"
)

// The app commands: the catalog, and app instances (an app running on an allocation,
// reached in the browser through the control plane's app proxy; docs/apps.md).
func (a *app) appCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "app",
		Aliases: []string{"apps"},
		Short:   "Launch catalog apps (Jupyter, inference servers, ...) and open them in the browser",
		Example: `  gantry app catalog
  gantry app launch jupyter --version 6.4 --alloc train --wait
  gantry app launch hello --version 1 --sku h100-80gb-sxm.1x --wait
  gantry app open notebook
  gantry app list
  gantry app stop notebook`,
	}
	cmd.AddCommand(a.appCatalogCmd(), a.appLaunchCmd(), a.appListCmd(), a.appGetCmd(), a.appOpenCmd(), a.appStopCmd())
	return cmd
}

func (a *app) appCatalogCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "catalog",
		Short: "List the app catalog, with whether your tenant may launch each app",
		Example: `  gantry app catalog
  gantry app catalog -o json | jq -r '.[] | select(.entitled) | .slug'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			s, err := a.session()
			if err != nil {
				return err
			}
			project, err := a.project(ctx, s)
			if err != nil {
				return err
			}
			items := []api.App{}
			var cursor *string
			for {
				res, err := s.API.ListAppsWithResponse(ctx, &api.ListAppsParams{XProjectID: project, Cursor: cursor})
				if err != nil {
					return err
				}
				if err := ok(res.HTTPResponse, res.Body); err != nil {
					return err
				}
				items = append(items, res.JSON200.Items...)
				if cursor = res.JSON200.Pagination.NextCursor; cursor == nil {
					break
				}
			}
			return a.printer().Print(items, func(t *output.TableWriter) {
				t.Row("SLUG", "NAME", "KIND", "LATEST", "VERSIONS", "ENTITLED", "DEPRECATED")
				for _, ap := range items {
					vs := make([]string, 0, len(ap.Versions))
					for _, v := range ap.Versions {
						if !v.Deprecated {
							vs = append(vs, v.Version)
						}
					}
					t.Row(ap.Slug, ap.Name, string(ap.Kind), str(ap.LatestVersion), strings.Join(vs, ","), yesNo(ap.Entitled), yesNo(ap.Deprecated))
				}
			})
		},
	}
}

func (a *app) appLaunchCmd() *cobra.Command {
	var version, name, allocRef, sku, region string
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "launch APP --version V (--alloc ALLOC | --sku SKU)",
		Short: "Launch an app on an allocation of yours, or on a new one (with --wait, until it runs)",
		Long: `Launch version V of catalog app APP on an active allocation of the project (--alloc, by
id or name) or on a new allocation of SKU launched for it (--sku; it is released when the
app stops). --version defaults to the app's latest version. With --wait the command shows
the instance's state until it is running (exit 0) or has failed or stopped (exit 10);
Ctrl-C stops waiting and leaves the app starting (exit 130).`,
		Example: `  gantry app launch jupyter --alloc train --wait
  gantry app launch hello --version 1 --sku h100-80gb-sxm.1x --name demo --wait -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if (allocRef == "") == (sku == "") {
				return usageErr(fmt.Errorf("give exactly one of --alloc and --sku"))
			}
			s, err := a.session()
			if err != nil {
				return err
			}
			project, err := a.project(ctx, s)
			if err != nil {
				return err
			}
			if version == "" {
				if version, err = latestVersion(ctx, s, project, args[0]); err != nil {
					return err
				}
			}
			body := api.CreateAppInstanceJSONRequestBody{AppSlug: args[0], Version: version, Name: name}
			if body.Name == "" {
				body.Name = args[0] + "-" + uuid.NewString()[:6]
			}
			if allocRef != "" {
				id, err := a.resolveAlloc(ctx, s, project, allocRef)
				if err != nil {
					return err
				}
				body.AllocationID = &id
			} else {
				body.Sku = &sku
				if region != "" {
					body.RegionCode = &region
				}
			}
			// One key for the command: a retried request cannot launch twice.
			idem := uuid.NewString()
			res, err := s.API.CreateAppInstanceWithResponse(ctx, &api.CreateAppInstanceParams{XProjectID: project, IdempotencyKey: &idem}, body)
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			inst := res.JSON201
			if wait {
				if inst, err = a.waitForInstance(ctx, s, project, inst, timeout); err != nil {
					return err
				}
			}
			if err := a.printer().Print(inst, func(t *output.TableWriter) { instancePairs(t, s, inst) }); err != nil {
				return err
			}
			if wait && inst.State != api.AppInstanceStateRunning {
				return &exitError{code: ExitFailed, err: fmt.Errorf("app instance %s is %s: %s", inst.ID, inst.State, str(inst.StateReason))}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&version, "version", "", "app version (default: the app's latest)")
	f.StringVar(&name, "name", "", "name of the instance (default: the app's slug and a random suffix)")
	f.StringVar(&allocRef, "alloc", "", "run on this active allocation (id or name)")
	f.StringVar(&sku, "sku", "", "launch a new allocation of this SKU for the app")
	f.StringVar(&region, "region", "", "with --sku: region code")
	f.BoolVar(&wait, "wait", false, "wait until the app is running, with a live status line")
	f.DurationVar(&timeout, "timeout", 15*time.Minute, "with --wait, stop waiting after this long (the app is left as it is)")
	return cmd
}

// latestVersion is the app's newest version that is not deprecated.
func latestVersion(ctx context.Context, s *apiclient.Session, project uuid.UUID, slug string) (string, error) {
	var cursor *string
	for {
		res, err := s.API.ListAppsWithResponse(ctx, &api.ListAppsParams{XProjectID: project, Cursor: cursor})
		if err != nil {
			return "", err
		}
		if err := ok(res.HTTPResponse, res.Body); err != nil {
			return "", err
		}
		for _, ap := range res.JSON200.Items {
			if ap.Slug == slug {
				if ap.LatestVersion == nil {
					return "", notFoundErr(fmt.Errorf("app %q has no version that can be launched", slug))
				}
				return *ap.LatestVersion, nil
			}
		}
		if cursor = res.JSON200.Pagination.NextCursor; cursor == nil {
			return "", notFoundErr(fmt.Errorf("no app %q in the catalog (gantry app catalog)", slug))
		}
	}
}

func instanceSettled(st api.AppInstanceState) bool {
	switch st {
	case api.AppInstanceStateRunning, api.AppInstanceStateFailed, api.AppInstanceStateStopped:
		return true
	}
	return false
}

func instanceEnded(st api.AppInstanceState) bool {
	return st == api.AppInstanceStateFailed || st == api.AppInstanceStateStopped
}

// waitForInstance polls the instance until it is running or has ended, drawing a live
// status line on a terminal (a line per change otherwise). Ctrl-C stops the wait only.
func (a *app) waitForInstance(ctx context.Context, s *apiclient.Session, project uuid.UUID, inst *api.AppInstance, timeout time.Duration) (*api.AppInstance, error) {
	return a.pollInstance(ctx, s, project, inst, timeout, instanceSettled)
}

func (a *app) pollInstance(ctx context.Context, s *apiclient.Session, project uuid.UUID, inst *api.AppInstance, timeout time.Duration, done func(api.AppInstanceState) bool) (*api.AppInstance, error) {
	return waitUntil(ctx, a, inst, timeout, waitSpec[*api.AppInstance]{
		noun: "app instance",
		show: func(in *api.AppInstance) (string, string, string) { return in.Name, in.ID.String(), string(in.State) },
		done: func(in *api.AppInstance) bool { return done(in.State) },
		get: func(ctx context.Context) (*api.AppInstance, error) {
			res, err := s.API.GetAppInstanceWithResponse(ctx, inst.ID, &api.GetAppInstanceParams{XProjectID: project})
			if err != nil {
				return nil, err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return nil, err
			}
			return res.JSON200, nil
		},
		left: func(in *api.AppInstance) string {
			return fmt.Sprintf("gantry app get %s; gantry app stop %s", in.ID, in.ID)
		},
	})
}

func listInstances(ctx context.Context, s *apiclient.Session, project uuid.UUID) ([]api.AppInstance, error) {
	out := []api.AppInstance{}
	var cursor *string
	for {
		res, err := s.API.ListAppInstancesWithResponse(ctx, &api.ListAppInstancesParams{XProjectID: project, Cursor: cursor})
		if err != nil {
			return nil, err
		}
		if err := ok(res.HTTPResponse, res.Body); err != nil {
			return nil, err
		}
		out = append(out, res.JSON200.Items...)
		if cursor = res.JSON200.Pagination.NextCursor; cursor == nil {
			return out, nil
		}
	}
}

// resolveInstance finds INSTANCE by id, or by name among the project's instances (a live
// one wins over ended ones of the same name).
func (a *app) resolveInstance(ctx context.Context, ref string) (*apiclient.Session, uuid.UUID, uuid.UUID, error) {
	s, err := a.session()
	if err != nil {
		return nil, uuid.Nil, uuid.Nil, err
	}
	project, err := a.project(ctx, s)
	if err != nil {
		return nil, uuid.Nil, uuid.Nil, err
	}
	if id, err := uuid.Parse(ref); err == nil {
		return s, project, id, nil
	}
	all, err := listInstances(ctx, s, project)
	if err != nil {
		return nil, uuid.Nil, uuid.Nil, err
	}
	id, err := pickByName(all, ref, "app instance", "gantry app list",
		func(in api.AppInstance) (string, uuid.UUID, bool) {
			return in.Name, uuid.UUID(in.ID), !instanceEnded(in.State)
		})
	if err != nil {
		return nil, uuid.Nil, uuid.Nil, err
	}
	return s, project, id, nil
}

func (a *app) appListCmd() *cobra.Command {
	var live bool
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls", "ps"},
		Short:   "List the project's app instances",
		Example: `  gantry app list
  gantry app list --live -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := a.session()
			if err != nil {
				return err
			}
			project, err := a.project(cmd.Context(), s)
			if err != nil {
				return err
			}
			all, err := listInstances(cmd.Context(), s, project)
			if err != nil {
				return err
			}
			items := make([]api.AppInstance, 0, len(all))
			for _, in := range all {
				if !live || !instanceEnded(in.State) {
					items = append(items, in)
				}
			}
			return a.printer().Print(items, func(t *output.TableWriter) {
				t.Row("ID", "NAME", "APP", "VERSION", "STATE", "ALLOCATION", "RESTARTS", "CREATED")
				for _, in := range items {
					t.Row(in.ID.String(), in.Name, in.AppSlug, in.Version, string(in.State), in.AllocationID.String(), fmt.Sprint(in.RestartCount), ts(in.CreatedAt))
				}
			})
		},
	}
	cmd.Flags().BoolVar(&live, "live", false, "only instances that have not stopped or failed")
	return cmd
}

func instancePairs(t *output.TableWriter, s *apiclient.Session, in *api.AppInstance) {
	node := ""
	if in.NodeID != nil {
		node = in.NodeID.String()
	}
	t.Pairs("ID", in.ID.String(), "Name", in.Name, "App", in.AppName+" ("+in.AppSlug+" "+in.Version+")", "Kind", string(in.Kind),
		"State", string(in.State), "Reason", str(in.StateReason), "Allocation", in.AllocationID.String(),
		"Allocation launched for it", yesNo(in.AllocationLaunched), "Node", node, "Port", fmt.Sprint(in.Port),
		"Restarts", fmt.Sprint(in.RestartCount), "Proxy", strings.TrimSuffix(s.Profile.URL, "/")+in.ProxyPath,
		"Created", ts(in.CreatedAt), "Running since", tsPtr(in.RunningAt), "Last report", tsPtr(in.LastReportAt), "Ended", tsPtr(in.EndedAt))
}

func (a *app) appGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "get INSTANCE",
		Short: "Show one app instance (by id or name)",
		Example: `  gantry app get notebook
  gantry app get notebook -o yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, project, id, err := a.resolveInstance(ctx, args[0])
			if err != nil {
				return err
			}
			res, err := s.API.GetAppInstanceWithResponse(ctx, id, &api.GetAppInstanceParams{XProjectID: project})
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			return a.printer().Print(res.JSON200, func(t *output.TableWriter) { instancePairs(t, s, res.JSON200) })
		},
	}
}

func (a *app) appOpenCmd() *cobra.Command {
	var noBrowser bool
	cmd := &cobra.Command{
		Use:   "open INSTANCE",
		Short: "Open a running app in the browser (a single-use sign-in link, valid 60 s)",
		Long: `Mints a single-use link that signs the browser in to this app instance only (an
HTTP-only cookie scoped to the instance's proxy path), prints it and opens it in the
browser. The link works once and for 60 seconds; run the command again for a new one.`,
		Example: `  gantry app open notebook
  gantry app open notebook --no-browser -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, project, id, err := a.resolveInstance(ctx, args[0])
			if err != nil {
				return err
			}
			res, err := s.API.CreateAppProxySessionWithResponse(ctx, id, &api.CreateAppProxySessionParams{XProjectID: project})
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			sess := res.JSON201
			link := sess.URL
			if strings.HasPrefix(link, "/") {
				link = strings.TrimSuffix(s.Profile.URL, "/") + link
			}
			out := struct {
				AppInstanceID string    `json:"app_instance_id"`
				URL           string    `json:"url"`
				ExpiresAt     time.Time `json:"expires_at"`
			}{sess.AppInstanceID.String(), link, sess.ExpiresAt}
			if !noBrowser {
				if err := openBrowser(link); err != nil {
					fmt.Fprintf(a.errOut, "(could not open a browser: %v; open the link yourself)\n", err)
				}
			}
			return a.printer().Print(out, func(t *output.TableWriter) {
				t.Pairs("App instance", out.AppInstanceID, "Link (once, until)", ts(out.ExpiresAt), "URL", out.URL)
			})
		},
	}
	cmd.Flags().BoolVar(&noBrowser, "no-browser", false, "print the link only")
	return cmd
}

func (a *app) appStopCmd() *cobra.Command {
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "stop INSTANCE",
		Short: "Stop an app instance (an allocation launched for it is released)",
		Example: `  gantry app stop notebook
  gantry app stop notebook --wait`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, project, id, err := a.resolveInstance(ctx, args[0])
			if err != nil {
				return err
			}
			res, err := s.API.DeleteAppInstanceWithResponse(ctx, id, &api.DeleteAppInstanceParams{XProjectID: project})
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			inst := res.JSON202
			if wait {
				if inst, err = a.pollInstance(ctx, s, project, inst, timeout, instanceEnded); err != nil {
					return err
				}
			}
			return a.printer().Print(inst, func(t *output.TableWriter) { instancePairs(t, s, inst) })
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until it has stopped")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "with --wait, stop waiting after this long")
	return cmd
}
