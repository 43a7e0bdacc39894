// Package command is the `gantry` command tree (cobra). Each file holds one group of
// commands; every command talks to the control plane through apiclient (the generated
// client of the public API) and prints through output. Errors end in Run, which prints
// the API's code and correlation id and maps them to the documented exit codes.
package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/gantry-gpu/gantry/cli/internal/apiclient"
	"github.com/gantry-gpu/gantry/cli/internal/output"
	"github.com/gantry-gpu/gantry/cli/internal/profile"
	"github.com/gantry-gpu/gantry/proto/api"
)

// Version is set at build time (-ldflags "-X .../command.Version=...").
var Version = "dev"

// app is what every command shares: streams, global flags and the config file.
type app struct {
	in     io.Reader
	out    io.Writer
	errOut io.Writer

	profileFlag string
	projectFlag string
	outputFlag  string

	store profile.Store
	file  *profile.File
}

// Run executes the command line and returns the process exit code.
func Run(ctx context.Context, args []string, in io.Reader, out, errOut io.Writer) int {
	a := &app{in: in, out: out, errOut: errOut}
	root := a.root()
	root.SetArgs(args)
	root.SetIn(in)
	root.SetOut(out)
	root.SetErr(errOut)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var ex *exitError
	if errors.As(err, &ex) && ex.quiet {
		return ex.code
	}
	if strings.HasPrefix(err.Error(), "unknown command") {
		err = usageErr(err)
	}
	code := exitCode(err)
	fmt.Fprintf(errOut, "Error: %s\n", err)
	if hint := hintFor(err); hint != "" {
		fmt.Fprintf(errOut, "Hint: %s\n", hint)
	}
	return code
}

func (a *app) root() *cobra.Command {
	root := &cobra.Command{
		Use:   "gantry",
		Short: "Gantry GPU cloud command line",
		Long: `gantry talks to a Gantry control plane's public API: sign in, choose a project,
add SSH keys, launch GPU allocations, open a terminal or SSH into them, and see what
they cost.

Configuration and tokens live in the user config directory (gantry/config.json,
mode 0600); --profile (or GANTRY_PROFILE) keeps several control planes apart.

Exit codes: 0 ok; 1 other error; 2 usage; 3 not logged in or login expired/revoked;
4 permission denied; 5 not found; 6 conflict (wrong state, node offline, SKU
unavailable); 7 invalid input; 8 limit, quota or balance; 9 control plane
unavailable or internal error; 10 the allocation failed while waiting; 130 interrupted.
terminal and ssh exit with the remote command's status.`,
		Example: `  gantry login --url http://127.0.0.1:8080 -u alice
  gantry sku list
  gantry alloc create --sku h100-80gb-sxm.1x --wait
  gantry ssh first`,
		SilenceUsage:      true,
		SilenceErrors:     true,
		Version:           Version,
		PersistentPreRunE: a.prepare,
	}
	root.PersistentFlags().StringVar(&a.profileFlag, "profile", "", "profile (control plane and login) to use; default $GANTRY_PROFILE, else the current profile")
	root.PersistentFlags().StringVarP(&a.projectFlag, "project", "p", "", "project id or slug for this command; default $GANTRY_PROJECT, else the one chosen with \"gantry project use\"")
	root.PersistentFlags().StringVarP(&a.outputFlag, "output", "o", "table", "output format of read commands: table, json or yaml")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageErr(err) })
	_ = root.RegisterFlagCompletionFunc("output", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return []string{"table", "json", "yaml"}, cobra.ShellCompDirectiveNoFileComp
	})

	root.AddCommand(a.loginCmd(), a.logoutCmd(), a.whoamiCmd(), a.projectCmd(), a.sshKeyCmd(), a.skuCmd(),
		a.allocCmd(), a.appCmd(), a.balanceCmd(), a.invoiceCmd(), a.usageCmd(), a.budgetCmd(), a.terminalCmd(), a.sshCmd(), a.sshConfigCmd(), a.sshProxyCmd(), a.completionCmd(),
		a.bucketCmd(), a.lsCmd(), a.cpCmd(), a.quotaCmd())
	root.CompletionOptions.DisableDefaultCmd = true
	markUsageErrors(root)
	return root
}

// markUsageErrors makes cobra's argument and unknown-command errors exit 2 (usage).
func markUsageErrors(c *cobra.Command) {
	if args := c.Args; args != nil {
		c.Args = func(cmd *cobra.Command, a []string) error {
			if err := args(cmd, a); err != nil {
				return usageErr(err)
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		markUsageErrors(sub)
	}
}

// required checks a flag cobra would mark required, so its absence is a usage error.
func required(cmd *cobra.Command, names ...string) error {
	for _, n := range names {
		if !cmd.Flags().Changed(n) {
			return usageErr(fmt.Errorf("required flag --%s not set", n))
		}
	}
	return nil
}

func (a *app) prepare(cmd *cobra.Command, _ []string) error {
	if _, err := output.Parse(a.outputFlag); err != nil {
		return usageErr(err)
	}
	store, err := profile.DefaultStore()
	if err != nil {
		return err
	}
	a.store = store
	f, err := store.Load()
	if err != nil {
		return err
	}
	a.file = f
	return nil
}

func (a *app) printer() output.Printer {
	f, _ := output.Parse(a.outputFlag)
	return output.Printer{W: a.out, Format: f}
}

// profileName picks the profile: --profile, $GANTRY_PROFILE, the current one, "default".
func (a *app) profileName() string {
	for _, n := range []string{a.profileFlag, os.Getenv("GANTRY_PROFILE"), a.file.Current} {
		if n != "" {
			return n
		}
	}
	return profile.DefaultName
}

// session opens the chosen profile's login; $GANTRY_URL fills a profile with no URL.
func (a *app) session() (*apiclient.Session, error) {
	name := a.profileName()
	p, ok := a.file.Profiles[name]
	if !ok || !p.LoggedIn() {
		return nil, apiclient.ErrNotLoggedIn
	}
	return apiclient.New(a.store, a.file, name, p, "gantry-cli/"+Version)
}

// project resolves the project of a project-scoped command: --project, $GANTRY_PROJECT,
// the profile's choice, else the user's default project from GET /me. A value that is
// not a UUID is looked up by slug or name among the caller's projects.
func (a *app) project(ctx context.Context, s *apiclient.Session) (uuid.UUID, error) {
	ref := a.projectFlag
	if ref == "" {
		ref = os.Getenv("GANTRY_PROJECT")
	}
	if ref == "" {
		ref = s.Profile.ProjectID
	}
	if ref == "" {
		res, err := s.API.GetMeWithResponse(ctx, &api.GetMeParams{})
		if err != nil {
			return uuid.Nil, err
		}
		if err := ok(res.HTTPResponse, res.Body); err != nil {
			return uuid.Nil, err
		}
		if res.JSON200.ProjectID == nil {
			return uuid.Nil, usageErr(errors.New("no project chosen: run `gantry project list` and `gantry project use PROJECT`, or pass --project"))
		}
		return uuid.UUID(*res.JSON200.ProjectID), nil
	}
	if id, err := uuid.Parse(ref); err == nil {
		return id, nil
	}
	return a.findProject(ctx, s, ref)
}

func (a *app) findProject(ctx context.Context, s *apiclient.Session, ref string) (uuid.UUID, error) {
	res, err := s.API.ListProjectsWithResponse(ctx, &api.ListProjectsParams{})
	if err != nil {
		return uuid.Nil, err
	}
	if err := ok(res.HTTPResponse, res.Body); err != nil {
		return uuid.Nil, err
	}
	var found []api.Project
	for _, p := range res.JSON200.Items {
		if p.Slug == ref || strings.EqualFold(p.Name, ref) {
			found = append(found, p)
		}
	}
	switch len(found) {
	case 1:
		return uuid.UUID(found[0].ID), nil
	case 0:
		return uuid.Nil, notFoundErr(fmt.Errorf("no project %q among yours (gantry project list)", ref))
	}
	return uuid.Nil, usageErr(fmt.Errorf("%q names %d projects: use the project id", ref, len(found)))
}

// ok is apiclient.Check for a generated response's HTTP answer and body.
func ok(hr *http.Response, body []byte) error {
	return apiclient.Check(hr.StatusCode, hr.Header, body)
}
