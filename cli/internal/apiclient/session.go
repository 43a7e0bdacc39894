// Package apiclient is the CLI's connection to the public API: the generated client of
// proto/api behind a transport that adds the profile's bearer token, refreshes it before
// it expires (and once more when the server answers token_expired), and saves what it
// refreshed. It never imports control-plane code: the API is all it knows.
package apiclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gantry-gpu/gantry/cli/internal/profile"
	"github.com/gantry-gpu/gantry/proto/api"
)

// refreshAhead: an access token this close to expiry is refreshed before it is used, so
// a request does not fail on a token that expires while it travels.
const refreshAhead = 30 * time.Second

// Session is one profile's login in use by one command.
type Session struct {
	Store   profile.Store
	File    *profile.File
	Name    string
	Profile *profile.Profile
	HTTP    *http.Client // plain client: no auth added
	Now     func() time.Time

	API *api.ClientWithResponses // authenticated

	mu sync.Mutex
}

// New builds the session's clients. The profile must have a URL.
func New(store profile.Store, f *profile.File, name string, p *profile.Profile, userAgent string) (*Session, error) {
	if p.URL == "" {
		return nil, fmt.Errorf("profile %q has no control plane URL: run `gantry login --url URL`", name)
	}
	s := &Session{Store: store, File: f, Name: name, Profile: p, Now: time.Now,
		HTTP: &http.Client{Timeout: 60 * time.Second, Transport: uaTransport{ua: userAgent, next: http.DefaultTransport}}}
	authed := &http.Client{Timeout: 60 * time.Second, Transport: &bearerTransport{s: s, next: s.HTTP.Transport}}
	c, err := api.NewClientWithResponses(strings.TrimRight(p.URL, "/"), api.WithHTTPClient(authed))
	if err != nil {
		return nil, err
	}
	s.API = c
	return s, nil
}

// Anonymous is a client without a bearer token (login, token grant, refresh).
func (s *Session) Anonymous() *api.ClientWithResponses {
	c, _ := api.NewClientWithResponses(strings.TrimRight(s.Profile.URL, "/"), api.WithHTTPClient(s.HTTP))
	return c
}

// Token returns a valid access token, refreshing first when it is about to expire.
func (s *Session) Token(ctx context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.Profile.LoggedIn() {
		return "", ErrNotLoggedIn
	}
	if !s.Profile.AccessExpiresAt.IsZero() && s.Now().Add(refreshAhead).After(s.Profile.AccessExpiresAt) {
		if err := s.refreshLocked(ctx); err != nil {
			return "", err
		}
	}
	return s.Profile.AccessToken, nil
}

// Refresh forces a refresh (after the server said token_expired).
func (s *Session) Refresh(ctx context.Context, used string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.Profile.AccessToken != used { // another request refreshed meanwhile
		return s.Profile.AccessToken, nil
	}
	if err := s.refreshLocked(ctx); err != nil {
		return "", err
	}
	return s.Profile.AccessToken, nil
}

func (s *Session) refreshLocked(ctx context.Context) error {
	p := s.Profile
	switch {
	case p.ClientID != "" && p.ClientSecret != "":
		tok, err := s.ClientCredentials(ctx, p.ClientID, p.ClientSecret)
		if err != nil {
			return &LoginExpiredError{Profile: s.Name, Cause: err}
		}
		p.AccessToken = tok.AccessToken
		p.AccessExpiresAt = s.Now().Add(time.Duration(tok.ExpiresIn) * time.Second)
	case p.RefreshToken != "":
		res, err := s.Anonymous().RefreshTokenWithResponse(ctx, &api.RefreshTokenParams{}, api.RefreshTokenJSONRequestBody{RefreshToken: p.RefreshToken})
		if err != nil {
			return err
		}
		if err := Check(res.StatusCode(), res.HTTPResponse.Header, res.Body); err != nil {
			var ae *Error
			if errors.As(err, &ae) && ae.Status == http.StatusUnauthorized {
				return &LoginExpiredError{Profile: s.Name, Cause: err}
			}
			return err
		}
		s.ApplyTokens(res.JSON200)
	default:
		return &LoginExpiredError{Profile: s.Name}
	}
	return s.Save()
}

// ApplyTokens records a password/refresh grant's answer in the profile.
func (s *Session) ApplyTokens(t *api.AuthTokenResponse) {
	now := s.Now()
	p := s.Profile
	p.AccessToken = t.AccessToken
	p.AccessExpiresAt = now.Add(time.Duration(t.ExpiresIn) * time.Second)
	p.RefreshToken = t.RefreshToken
	p.RefreshExpiresAt = now.Add(time.Duration(t.RefreshExpiresIn) * time.Second)
	p.Username = t.User.Username
	p.ClientID, p.ClientSecret = "", ""
}

// ClientCredentials runs the client-credentials grant.
func (s *Session) ClientCredentials(ctx context.Context, id, secret string) (*api.ClientCredentialsTokenResponse, error) {
	grant := "client_credentials"
	res, err := s.Anonymous().IssueAccessTokenWithFormdataBodyWithResponse(ctx, &api.IssueAccessTokenParams{},
		api.IssueAccessTokenFormdataRequestBody{GrantType: &grant, ClientID: &id, ClientSecret: &secret})
	if err != nil {
		return nil, err
	}
	if err := Check(res.StatusCode(), res.HTTPResponse.Header, res.Body); err != nil {
		return nil, err
	}
	return res.JSON200, nil
}

// Save writes the config file.
func (s *Session) Save() error { return s.Store.Save(s.File) }

type uaTransport struct {
	ua   string
	next http.RoundTripper
}

func (t uaTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("User-Agent", t.ua)
	return t.next.RoundTrip(r)
}

// bearerTransport adds the access token and retries a request once after a refresh when
// the server answers 401 token_expired (a clock skew or a token that expired in flight).
type bearerTransport struct {
	s    *Session
	next http.RoundTripper
}

func (t *bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	tok, err := t.s.Token(r.Context())
	if err != nil {
		return nil, err
	}
	res, err := t.send(r, tok)
	if err != nil || res.StatusCode != http.StatusUnauthorized || r.GetBody == nil && r.Body != nil && r.Body != http.NoBody {
		return res, err
	}
	body, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	res.Body.Close()
	res.Body = io.NopCloser(bytes.NewReader(body))
	var ae *Error
	if !errors.As(Check(res.StatusCode, res.Header, body), &ae) || ae.Code != "token_expired" {
		return res, nil
	}
	tok, err = t.s.Refresh(r.Context(), tok)
	if err != nil {
		return nil, err
	}
	if r.GetBody != nil {
		b, err := r.GetBody()
		if err != nil {
			return nil, err
		}
		r.Body = b
	}
	return t.send(r, tok)
}

func (t *bearerTransport) send(r *http.Request, tok string) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+tok)
	return t.next.RoundTrip(r)
}
