package command

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/gantry-gpu/gantry/cli/internal/output"
	"github.com/gantry-gpu/gantry/proto/api"
)

func (a *app) sshKeyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ssh-key",
		Short: "Manage the SSH public keys put on your allocations",
		Example: `  gantry ssh-key add
  gantry ssh-key list
  gantry ssh-key rm laptop`,
	}
	var name string
	add := &cobra.Command{
		Use:   "add [FILE]",
		Short: "Add a public key (default: your key in ~/.ssh/*.pub)",
		Long: `Add an OpenSSH public key. Without FILE the key is read from ~/.ssh: the first of
id_ed25519.pub, id_ecdsa.pub and id_rsa.pub that exists, else the only *.pub there.
The name defaults to the key's comment, else the file name.`,
		Example: `  gantry ssh-key add
  gantry ssh-key add ~/.ssh/work.pub --name work-laptop`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := a.session()
			if err != nil {
				return err
			}
			path := ""
			if len(args) == 1 {
				path = args[0]
			} else if path, err = defaultPublicKey(); err != nil {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return usageErr(err)
			}
			line := strings.TrimSpace(string(b))
			if strings.Contains(line, "PRIVATE KEY") {
				return usageErr(fmt.Errorf("%s is a private key: give the .pub file", path))
			}
			keyName := name
			if keyName == "" {
				if f := strings.Fields(line); len(f) >= 3 {
					keyName = strings.Join(f[2:], " ")
				} else {
					keyName = strings.TrimSuffix(filepath.Base(path), ".pub")
				}
			}
			idem := uuid.NewString()
			res, err := s.API.CreateSSHKeyWithResponse(cmd.Context(), &api.CreateSSHKeyParams{IdempotencyKey: &idem},
				api.CreateSSHKeyJSONRequestBody{Name: keyName, PublicKey: line})
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			return a.printer().Print(res.JSON201, func(t *output.TableWriter) { sshKeyTable(t, []api.SSHKey{*res.JSON201}) })
		},
	}
	add.Flags().StringVar(&name, "name", "", "name of the key (default: its comment, else the file name)")
	cmd.AddCommand(add, &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List your SSH keys",
		Example: `  gantry ssh-key list
  gantry ssh-key list -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := a.session()
			if err != nil {
				return err
			}
			keys, err := listSSHKeys(cmd, s.API)
			if err != nil {
				return err
			}
			return a.printer().Print(keys, func(t *output.TableWriter) { sshKeyTable(t, keys) })
		},
	}, &cobra.Command{
		Use:     "rm KEY",
		Aliases: []string{"remove", "delete"},
		Short:   "Remove an SSH key (by id, name or fingerprint)",
		Example: `  gantry ssh-key rm laptop
  gantry ssh-key rm SHA256:u3mJ...`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := a.session()
			if err != nil {
				return err
			}
			keys, err := listSSHKeys(cmd, s.API)
			if err != nil {
				return err
			}
			var match []api.SSHKey
			for _, k := range keys {
				if k.ID.String() == args[0] || k.Name == args[0] || k.Fingerprint == args[0] {
					match = append(match, k)
				}
			}
			switch {
			case len(match) == 0:
				return notFoundErr(fmt.Errorf("no SSH key %q (gantry ssh-key list)", args[0]))
			case len(match) > 1:
				return usageErr(fmt.Errorf("%q matches %d keys: use the key id", args[0], len(match)))
			}
			res, err := s.API.DeleteSSHKeyWithResponse(cmd.Context(), match[0].ID, &api.DeleteSSHKeyParams{})
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			fmt.Fprintf(a.errOut, "Removed SSH key %s (%s).\n", match[0].Name, match[0].Fingerprint)
			return nil
		},
	})
	return cmd
}

func listSSHKeys(cmd *cobra.Command, c *api.ClientWithResponses) ([]api.SSHKey, error) {
	out := []api.SSHKey{}
	var cursor *string
	for {
		res, err := c.ListSSHKeysWithResponse(cmd.Context(), &api.ListSSHKeysParams{Cursor: cursor})
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

func sshKeyTable(t *output.TableWriter, keys []api.SSHKey) {
	t.Row("ID", "NAME", "TYPE", "FINGERPRINT", "CREATED")
	for _, k := range keys {
		t.Row(k.ID.String(), k.Name, k.KeyType, k.Fingerprint, ts(k.CreatedAt))
	}
}

func defaultPublicKey() (string, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(home, ".ssh")
	for _, n := range []string{"id_ed25519.pub", "id_ecdsa.pub", "id_rsa.pub"} {
		if _, err := os.Stat(filepath.Join(dir, n)); err == nil {
			return filepath.Join(dir, n), nil
		}
	}
	all, _ := filepath.Glob(filepath.Join(dir, "*.pub"))
	switch len(all) {
	case 1:
		return all[0], nil
	case 0:
		return "", usageErr(errors.New("no public key in ~/.ssh: create one with ssh-keygen -t ed25519, or name the file"))
	}
	return "", usageErr(fmt.Errorf("several keys in ~/.ssh (%s): name the one to add", strings.Join(all, ", ")))
}
