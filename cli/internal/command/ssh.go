package command

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/gantry-gpu/gantry/cli/internal/apiclient"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/sshproxy"
)

func (a *app) sshProxyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ssh-proxy ALLOC",
		Short: "Carry one SSH connection to an allocation (an OpenSSH ProxyCommand)",
		Long: `Connect stdin and stdout to the allocation's SSH server through the control plane
and the node's tunnel: OpenSSH runs it as its ProxyCommand (gantry ssh and gantry
ssh-config set that up). SSH stays end to end; the command only carries its bytes.
Errors go to stderr; stdout carries SSH only.`,
		Example: `  ssh -o ProxyCommand="gantry ssh-proxy --project $PROJECT %h" g0193a0c47f2e@0193a0c4-7f2e-7c1d-8e4b-5a6f7d8e9f00`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, project, id, err := a.allocArg(ctx, args[0])
			if err != nil {
				return err
			}
			err = sshproxy.Run(ctx, sshproxy.Options{
				BaseURL: s.Profile.URL, HTTPClient: s.HTTP, ProjectID: project, AllocationID: id,
				Bearer: s.Token,
			}, a.in, a.out)
			var pe *sshproxy.Error
			if errors.As(err, &pe) {
				return &apiclient.Error{Status: pe.Status, Code: pe.Code, Message: pe.Message, CorrelationID: pe.CorrelationID}
			}
			return err
		},
	}
}

// proxyCommand is the ProxyCommand that runs this very binary with the same profile.
func (a *app) proxyCommand(project uuid.UUID, host string) string {
	self, err := os.Executable()
	if err != nil {
		self = "gantry"
	}
	cmd := shellQuote(self)
	if a.profileFlag != "" {
		cmd += " --profile " + shellQuote(a.profileFlag)
	}
	return cmd + " ssh-proxy --project " + project.String() + " " + host
}

// sshOptions are what `gantry ssh` and ssh-config both set: the proxy, and a host key
// remembered per allocation (trusted on first use; a changed key later is refused).
func (a *app) sshOptions(project, id uuid.UUID) []string {
	return []string{
		"ProxyCommand=" + a.proxyCommand(project, "%h"),
		"HostKeyAlias=gantry-" + id.String(),
		"StrictHostKeyChecking=accept-new",
		"ServerAliveInterval=15",
	}
}

func (a *app) sshTarget(ctx context.Context, ref string) (*api.Allocation, uuid.UUID, error) {
	s, project, id, err := a.allocArg(ctx, ref)
	if err != nil {
		return nil, uuid.Nil, err
	}
	res, err := s.API.GetAllocationWithResponse(ctx, id, &api.GetAllocationParams{XProjectID: project})
	if err != nil {
		return nil, uuid.Nil, err
	}
	if err := ok(res.HTTPResponse, res.Body); err != nil {
		return nil, uuid.Nil, err
	}
	al := res.JSON200
	if al.Connection == nil || (al.Status != api.V3WorkloadStatusActive && al.Status != api.V3WorkloadStatusIdle) {
		return nil, uuid.Nil, &exitError{code: ExitConflict, err: fmt.Errorf("allocation %s is %s: SSH needs an active allocation", al.ID, al.Status)}
	}
	return al, project, nil
}

func (a *app) sshCmd() *cobra.Command {
	var identity string
	var sshArgs []string
	cmd := &cobra.Command{
		Use:   "ssh ALLOC [-- COMMAND...]",
		Short: "SSH into an allocation through the node's tunnel (runs the system ssh)",
		Long: `Run the system ssh to the allocation (by id or name) with gantry ssh-proxy as its
ProxyCommand, so it works wherever the node is (behind NAT too). Your SSH key must be
one of the allocation's (gantry ssh-key add before launching). The allocation's host
key is remembered under the alias gantry-<allocation id> on first use. Exits with the
remote command's status (255 for an SSH error, as ssh does).`,
		Example: `  gantry ssh train
  gantry ssh train -- nvidia-smi
  gantry ssh train -i ~/.ssh/work_ed25519 --ssh-arg=-L --ssh-arg=8888:localhost:8888`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			al, project, err := a.sshTarget(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			sshBin, err := exec.LookPath("ssh")
			if err != nil {
				return errors.New("no ssh on PATH: install OpenSSH's client")
			}
			argv := []string{}
			for _, o := range a.sshOptions(project, uuid.UUID(al.ID)) {
				argv = append(argv, "-o", o)
			}
			if identity != "" {
				argv = append(argv, "-i", identity, "-o", "IdentitiesOnly=yes")
			}
			argv = append(argv, sshArgs...)
			argv = append(argv, al.Connection.User+"@"+al.ID.String())
			if len(args) > 1 {
				argv = append(argv, "--")
				argv = append(argv, args[1:]...)
			}
			c := exec.Command(sshBin, argv...)
			c.Stdin, c.Stdout, c.Stderr = a.in, a.out, a.errOut
			err = c.Run()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return &exitError{code: ee.ExitCode(), quiet: true}
			}
			return err
		},
	}
	cmd.Flags().StringVarP(&identity, "identity", "i", "", "private key file to use (passed to ssh -i)")
	cmd.Flags().StringArrayVar(&sshArgs, "ssh-arg", nil, "extra argument for ssh (repeatable), e.g. --ssh-arg=-L --ssh-arg=8888:localhost:8888")
	return cmd
}

func (a *app) sshConfigCmd() *cobra.Command {
	var prefix string
	return func() *cobra.Command {
		cmd := &cobra.Command{
			Use:   "ssh-config [ALLOC...]",
			Short: "Print a ~/.ssh/config block for the project's active allocations",
			Long: `Print one Host block per active allocation (or the ones named), so ssh, scp, rsync,
sftp and editors' remote-SSH reach them by name through gantry ssh-proxy. Host names are
the prefix and the allocation's name.`,
			Example: `  gantry ssh-config >> ~/.ssh/config && ssh gantry-train
  gantry ssh-config train > ~/.ssh/gantry.conf   # then: Include gantry.conf
  scp -F <(gantry ssh-config) data.tar gantry-train:`,
			RunE: func(cmd *cobra.Command, args []string) error {
				ctx := cmd.Context()
				s, err := a.session()
				if err != nil {
					return err
				}
				project, err := a.project(ctx, s)
				if err != nil {
					return err
				}
				var targets []api.Allocation
				if len(args) == 0 {
					all, err := listAllocs(ctx, s, project)
					if err != nil {
						return err
					}
					for _, al := range all {
						if al.Connection != nil && (al.Status == api.V3WorkloadStatusActive || al.Status == api.V3WorkloadStatusIdle) {
							targets = append(targets, al)
						}
					}
				} else {
					for _, ref := range args {
						al, _, err := a.sshTarget(ctx, ref)
						if err != nil {
							return err
						}
						targets = append(targets, *al)
					}
				}
				var b strings.Builder
				fmt.Fprintf(&b, "# gantry ssh-config: project %s\n", project)
				for _, al := range targets {
					fmt.Fprintf(&b, "Host %s%s\n  HostName %s\n  User %s\n", prefix, al.Name, al.ID, al.Connection.User)
					for _, o := range a.sshOptions(project, uuid.UUID(al.ID)) {
						k, v, _ := strings.Cut(o, "=")
						fmt.Fprintf(&b, "  %s %s\n", k, v)
					}
				}
				_, err = fmt.Fprint(a.out, b.String())
				return err
			},
		}
		cmd.Flags().StringVar(&prefix, "prefix", "gantry-", "prefix of the Host names")
		return cmd
	}()
}

// shellQuote quotes s for the shell OpenSSH runs ProxyCommand with.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:@%+=", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
