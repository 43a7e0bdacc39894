package command

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"runtime"
	"strings"

	"github.com/gantry-gpu/gantry/cli/internal/apiclient"
	"github.com/gantry-gpu/gantry/cli/internal/tty"
	"github.com/gantry-gpu/gantry/proto/api"
)

// ssoStartURL is the control plane's enterprise sign-in entry for a tenant (its slug).
func ssoStartURL(base, provider string) string {
	return strings.TrimRight(base, "/") + "/api/v1/auth/oidc/" + url.PathEscape(provider) + "/start"
}

// ssoLogin signs in through the tenant's identity provider with the browser flow the
// control plane already serves. The flow's state is bound to a cookie of the browser that
// starts it and is spent by the first callback, so the browser must run the whole flow
// itself; the callback then answers the token JSON in that browser. The user pastes the
// refresh token (or the whole JSON) here and the CLI redeems it at once: the refresh rotates
// it, so the copy left on the browser page is dead as soon as the CLI holds its own.
func (a *app) ssoLogin(ctx context.Context, s *apiclient.Session, provider string, noBrowser, tokenStdin bool) error {
	if provider == "" {
		return usageErr(errors.New("--sso needs the organization's sign-in name (its tenant slug)"))
	}
	start := ssoStartURL(s.Profile.URL, provider)
	fmt.Fprintf(a.errOut, "Sign in through your organization's identity provider:\n\n  %s\n\n", start)
	if !noBrowser {
		if err := openBrowser(start); err != nil {
			fmt.Fprintf(a.errOut, "(could not open a browser: %v; open the URL yourself)\n", err)
		}
	}
	fmt.Fprintln(a.errOut, "The sign-in ends on a page of JSON; copy its refresh_token (or the whole page) and paste it here.")
	var pasted string
	var err error
	if tokenStdin {
		pasted, err = tty.ReadLine(a.in)
		if err != nil {
			return usageErr(fmt.Errorf("read the sign-in answer from stdin: %w", err))
		}
	} else if pasted, err = a.prompt("Refresh token: ", true); err != nil {
		return err
	}
	refresh, err := refreshFromPaste(pasted)
	if err != nil {
		return usageErr(err)
	}
	res, err := s.Anonymous().RefreshTokenWithResponse(ctx, &api.RefreshTokenParams{}, api.RefreshTokenJSONRequestBody{RefreshToken: refresh})
	if err != nil {
		return err
	}
	if err := ok(res.HTTPResponse, res.Body); err != nil {
		return err
	}
	s.Profile.ClearLogin()
	s.ApplyTokens(res.JSON200)
	return nil
}

// refreshFromPaste takes either the bare refresh token or the callback's JSON answer.
func refreshFromPaste(s string) (string, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "{") {
		var t struct {
			RefreshToken string `json:"refresh_token"`
		}
		if err := json.Unmarshal([]byte(s), &t); err != nil {
			return "", fmt.Errorf("the pasted sign-in answer is not the JSON page: %w", err)
		}
		s = t.RefreshToken
	}
	if s == "" || strings.ContainsAny(s, " \t\"{}") {
		return "", errors.New("no refresh token pasted: copy the refresh_token value from the page the sign-in ends on")
	}
	return s, nil
}

// openBrowser starts the platform's URL opener and does not wait for it.
func openBrowser(u string) error {
	var cmd *exec.Cmd
	switch runtime.GOOS {
	case "darwin":
		cmd = exec.Command("open", u)
	case "windows":
		cmd = exec.Command("rundll32", "url.dll,FileProtocolHandler", u)
	default:
		cmd = exec.Command("xdg-open", u)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() { _ = cmd.Wait() }()
	return nil
}
