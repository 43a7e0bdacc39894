package command

import (
	"fmt"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/gantry-gpu/gantry/cli/internal/output"
	"github.com/gantry-gpu/gantry/proto/api"
)

func (a *app) projectCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "project",
		Short: "List projects and choose the one commands use",
		Example: `  gantry project list
  gantry project use ml-research`,
	}
	cmd.AddCommand(&cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the projects you belong to (* marks the profile's project)",
		Example: `  gantry project list
  gantry project list -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := a.session()
			if err != nil {
				return err
			}
			res, err := s.API.ListProjectsWithResponse(cmd.Context(), &api.ListProjectsParams{})
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			items := append([]api.Project{}, res.JSON200.Items...)
			return a.printer().Print(items, func(t *output.TableWriter) {
				t.Row("", "ID", "SLUG", "NAME", "DEPARTMENT", "ROLE", "DEFAULT")
				for _, p := range items {
					mark := " "
					if p.ID.String() == s.Profile.ProjectID {
						mark = "*"
					}
					t.Row(mark, p.ID.String(), p.Slug, p.Name, p.DepartmentSlug, string(p.Role), yesNo(p.IsDefault))
				}
			})
		},
	}, &cobra.Command{
		Use:   "use PROJECT",
		Short: "Make PROJECT (id, slug or name) the profile's project",
		Example: `  gantry project use ml-research
  gantry project use 01936f2e-6c1a-7b5e-9f00-3c2d1e0a9b8c`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := a.session()
			if err != nil {
				return err
			}
			id, err := uuid.Parse(args[0])
			if err != nil {
				if id, err = a.findProject(cmd.Context(), s, args[0]); err != nil {
					return err
				}
			} else {
				// Check it is one of the caller's before recording it.
				res, err := s.API.GetProjectWithResponse(cmd.Context(), id, &api.GetProjectParams{})
				if err != nil {
					return err
				}
				if err := ok(res.HTTPResponse, res.Body); err != nil {
					return err
				}
			}
			s.Profile.ProjectID = id.String()
			if err := s.Save(); err != nil {
				return err
			}
			fmt.Fprintf(a.errOut, "Using project %s (profile %s).\n", id, s.Name)
			return nil
		},
	})
	return cmd
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
