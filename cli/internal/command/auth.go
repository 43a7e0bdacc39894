package command

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gantry-gpu/gantry/cli/internal/apiclient"
	"github.com/gantry-gpu/gantry/cli/internal/output"
	"github.com/gantry-gpu/gantry/cli/internal/tty"
	"github.com/gantry-gpu/gantry/proto/api"
)

func (a *app) loginCmd() *cobra.Command {
	var url, username, totp, recovery, clientID, clientSecret, sso string
	var passwordStdin, noBrowser, ssoStdin bool
	cmd := &cobra.Command{
		Use:   "login",
		Short: "Sign in and store the tokens in the profile",
		Long: `Sign in to a control plane with a username and password (and a TOTP code when
the account has one), or as a service account with its client id and secret.

The access and refresh tokens are stored in the profile (mode 0600) and refreshed
transparently; a service account's secret is stored so its short-lived tokens can be
renewed. The password is never stored. The password comes from a prompt without echo,
from --password-stdin, or from $GANTRY_PASSWORD.

A user of an organization federated through OIDC signs in with --sso and the
organization's sign-in name (its tenant slug): the CLI prints the sign-in URL and opens a
browser (unless --no-browser); the sign-in ends on a page of JSON whose refresh_token is
pasted back (or piped with --sso-token-stdin). The CLI redeems it at once, which rotates
it, so the copy left in the browser stops working.`,
		Example: `  gantry login --url http://127.0.0.1:8080 -u alice
  echo "$PASSWORD" | gantry login -u alice --password-stdin --totp 123456
  gantry login --client-id "$GANTRY_CLIENT_ID" --client-secret "$GANTRY_CLIENT_SECRET"
  gantry login --profile staging --url https://gantry.staging.example
  gantry login --url https://gantry.example --sso acme --no-browser`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			name := a.profileName()
			p := a.file.Get(name)
			if url == "" {
				url = os.Getenv("GANTRY_URL")
			}
			if url != "" {
				p.URL = strings.TrimRight(url, "/")
			}
			if p.URL == "" {
				return usageErr(errors.New("no control plane URL: pass --url (or set GANTRY_URL)"))
			}
			s, err := apiclient.New(a.store, a.file, name, p, "gantry-cli/"+Version)
			if err != nil {
				return err
			}
			if clientID == "" {
				clientID = os.Getenv("GANTRY_CLIENT_ID")
			}
			if clientID != "" {
				if clientSecret == "" {
					clientSecret = os.Getenv("GANTRY_CLIENT_SECRET")
				}
				if clientSecret == "" {
					if clientSecret, err = a.prompt("Client secret: ", true); err != nil {
						return err
					}
				}
				tok, err := s.ClientCredentials(ctx, clientID, clientSecret)
				if err != nil {
					return err
				}
				p.ClearLogin()
				p.ClientID, p.ClientSecret = clientID, clientSecret
				p.AccessToken = tok.AccessToken
				p.AccessExpiresAt = s.Now().Add(secs(tok.ExpiresIn))
				p.Username = "service account " + clientID
			} else if sso != "" {
				if err := a.ssoLogin(ctx, s, sso, noBrowser, ssoStdin); err != nil {
					return err
				}
			} else {
				if err := a.passwordLogin(cmd, s, username, totp, recovery, passwordStdin); err != nil {
					return err
				}
			}
			a.file.Current = name
			if err := s.Save(); err != nil {
				return err
			}
			fmt.Fprintf(a.errOut, "Logged in to %s as %s (profile %s).\n", p.URL, p.Username, name)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&url, "url", "", "control plane URL (default $GANTRY_URL, else the profile's)")
	f.StringVarP(&username, "username", "u", "", "username (default $GANTRY_USERNAME, else the profile's last one, else a prompt)")
	f.BoolVar(&passwordStdin, "password-stdin", false, "read the password from the first line of stdin")
	f.StringVar(&totp, "totp", "", "TOTP code, when the account has TOTP (prompted for on a terminal)")
	f.StringVar(&recovery, "recovery-code", "", "a one-time recovery code instead of a TOTP code")
	f.StringVar(&clientID, "client-id", "", "service account client id (default $GANTRY_CLIENT_ID)")
	f.StringVar(&clientSecret, "client-secret", "", "service account client secret (default $GANTRY_CLIENT_SECRET, else a prompt)")
	f.StringVar(&sso, "sso", "", "sign in through the identity provider of this organization (its tenant slug)")
	f.BoolVar(&noBrowser, "no-browser", false, "with --sso: print the sign-in URL without opening a browser")
	f.BoolVar(&ssoStdin, "sso-token-stdin", false, "with --sso: read the refresh token (or the callback's JSON) from the first line of stdin")
	return cmd
}

func (a *app) passwordLogin(cmd *cobra.Command, s *apiclient.Session, username, totp, recovery string, passwordStdin bool) error {
	ctx := cmd.Context()
	var err error
	if username == "" {
		username = os.Getenv("GANTRY_USERNAME")
	}
	if username == "" {
		username = s.Profile.Username
	}
	if username == "" || strings.HasPrefix(username, "service account ") {
		if username, err = a.prompt("Username: ", false); err != nil {
			return err
		}
	}
	var password string
	switch {
	case passwordStdin:
		if password, err = tty.ReadLine(a.in); err != nil {
			return usageErr(fmt.Errorf("read the password from stdin: %w", err))
		}
	case os.Getenv("GANTRY_PASSWORD") != "":
		password = os.Getenv("GANTRY_PASSWORD")
	default:
		if password, err = a.prompt("Password: ", true); err != nil {
			return err
		}
	}
	body := api.LoginJSONRequestBody{Username: username, Password: password}
	if totp != "" {
		body.TotpCode = &totp
	}
	if recovery != "" {
		body.RecoveryCode = &recovery
	}
	for attempt := 0; ; attempt++ {
		res, err := s.Anonymous().LoginWithResponse(ctx, &api.LoginParams{}, body)
		if err != nil {
			return err
		}
		err = ok(res.HTTPResponse, res.Body)
		var ae *apiclient.Error
		if err != nil && attempt == 0 && body.TotpCode == nil && body.RecoveryCode == nil &&
			errors.As(err, &ae) && ae.Reason == "mfa_required" && a.stdinIsTerminal() {
			code, perr := a.prompt("TOTP code: ", false)
			if perr != nil {
				return perr
			}
			body.TotpCode = &code
			continue
		}
		if err != nil {
			return err
		}
		s.Profile.ClearLogin()
		s.ApplyTokens(res.JSON200)
		return nil
	}
}

func (a *app) stdinIsTerminal() bool {
	f, isFile := a.in.(*os.File)
	return isFile && tty.IsTerminal(int(f.Fd()))
}

// prompt asks on stderr and reads a line from the terminal (without echo for secrets);
// without a terminal it refuses rather than hang on a pipe.
func (a *app) prompt(label string, secret bool) (string, error) {
	if !a.stdinIsTerminal() {
		return "", usageErr(fmt.Errorf("%s needed and stdin is not a terminal: pass it as a flag or environment variable", strings.TrimSuffix(strings.ToLower(label), ": ")))
	}
	fmt.Fprint(a.errOut, label)
	fd := int(a.in.(*os.File).Fd())
	if secret {
		v, err := tty.ReadPassword(fd)
		fmt.Fprintln(a.errOut)
		return v, err
	}
	return tty.ReadLine(a.in)
}

func (a *app) logoutCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "logout",
		Short: "Revoke the refresh token and forget the profile's login",
		Long: `Revoke the profile's refresh token at the control plane and remove its tokens (and
a service account's secret) from the config file. The profile keeps its URL and project.
The local login is forgotten even when the control plane cannot be reached.`,
		Example: `  gantry logout
  gantry logout --profile staging`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			name := a.profileName()
			p, exists := a.file.Profiles[name]
			if !exists || !p.LoggedIn() {
				fmt.Fprintf(a.errOut, "Profile %s is not logged in.\n", name)
				return nil
			}
			var revokeErr error
			if p.RefreshToken != "" {
				if s, err := a.session(); err == nil {
					res, err := s.API.LogoutWithResponse(cmd.Context(), &api.LogoutParams{}, api.LogoutJSONRequestBody{RefreshToken: p.RefreshToken})
					if err == nil {
						err = ok(res.HTTPResponse, res.Body)
					}
					revokeErr = err
				}
			}
			p.ClearLogin()
			if err := a.store.Save(a.file); err != nil {
				return err
			}
			if revokeErr != nil {
				fmt.Fprintf(a.errOut, "Logged out locally; the control plane did not confirm the revocation: %v\n", revokeErr)
				return nil
			}
			fmt.Fprintf(a.errOut, "Logged out (profile %s).\n", name)
			return nil
		},
	}
}

func (a *app) whoamiCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "whoami",
		Short: "Show who the profile is signed in as",
		Example: `  gantry whoami
  gantry whoami -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := a.session()
			if err != nil {
				return err
			}
			res, err := s.API.GetMeWithResponse(cmd.Context(), &api.GetMeParams{})
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			me := res.JSON200
			return a.printer().Print(me, func(t *output.TableWriter) {
				t.Pairs("Profile", s.Name, "URL", s.Profile.URL, "User", me.Username, "Role", string(me.Role),
					"Tenant", str(me.OrgName), "Default project", str(me.ProjectName), "Balance", money(me.Balance))
			})
		},
	}
}
