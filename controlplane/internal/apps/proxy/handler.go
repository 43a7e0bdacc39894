package proxy

import (
	"context"
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/bearer"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/correlation"
)

const (
	// Prefix is where the proxy is mounted.
	Prefix = "/api/v1/app-proxy/"
	// Route is the proxy's path template (audit rows, details.route).
	Route = "/api/v1/app-proxy/{app_instance_id}/*"
	// CodeParam carries an exchange code on a proxy URL (createAppProxySession's url);
	// a request with it is the exchange and never reaches the app.
	CodeParam = "gantry_proxy_code"
	// operationID names the proxy in denial audit rows.
	operationID = "proxyApp"
	serviceName = "gantry-controlplane"
)

var envelopes = apierr.Writer{Service: serviceName}

// InstancePath is the proxy path of an instance, with its trailing slash.
func InstancePath(id uuid.UUID) string { return Prefix + id.String() + "/" }

// Mount serves the proxy's prefix and hands every other request to next (the API).
func (s *Service) Mount(next http.Handler) http.Handler {
	own := correlation.Middleware(s)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, Prefix) {
			own.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// ServeHTTP serves ANY /api/v1/app-proxy/{app_instance_id}/*.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), Prefix)
	if !ok {
		s.fail(w, r, apierr.New(apierr.AppInstanceNotFound, "app instance not found"))
		return
	}
	idText, _, slash := strings.Cut(rest, "/")
	id, err := uuid.Parse(idText)
	if err != nil || len(idText) != 36 {
		s.fail(w, r, apierr.New(apierr.AppInstanceNotFound, "app instance not found"))
		return
	}
	if !slash {
		// Relative links in the app resolve against the directory: always end in "/".
		loc := InstancePath(id)
		if r.URL.RawQuery != "" {
			loc += "?" + r.URL.RawQuery
		}
		http.Redirect(w, r, loc, http.StatusPermanentRedirect)
		return
	}
	if r.URL.Query().Has(CodeParam) {
		s.spendCode(w, r, id)
		return
	}
	s.proxy(w, r, id)
}

// caller authenticates the request: a bearer token when one is sent, else the
// instance's cookie (the browser may hold several of that name from other paths; the
// first valid one for this instance counts). byCookie: a cookie was presented.
func (s *Service) caller(r *http.Request, id uuid.UUID) (p *principal.Principal, byCookie bool, err error) {
	if bearer.InAuthorization(r) {
		p, err := s.deps.Auth.Authenticate(r)
		return p, false, err
	}
	var first error
	for _, c := range r.Cookies() {
		if c.Name != CookieName {
			continue
		}
		p, err := s.cookiePrincipal(c.Value, id)
		if err == nil {
			return p, true, nil
		}
		if first == nil {
			first = err
		}
	}
	if first != nil {
		return nil, true, first
	}
	return nil, false, apierr.New(apierr.TokenMissing, "authentication required: send a bearer token, or open the app through its exchange URL")
}

// admitted is a caller who may use an instance.
type admitted struct {
	p       *principal.Principal
	target  Target
	project uuid.UUID // the project the call is made for
}

// admit resolves the instance and decides access: member or more in the instance's project,
// then whatever Grants admits. A caller of the instance's tenant without either is
// refused (403); anyone else is told the instance does not exist (404).
func (s *Service) admit(ctx context.Context, p *principal.Principal, id uuid.UUID) (admitted, error) {
	t, err := s.deps.Instances.ProxyTarget(ctx, id)
	if err != nil {
		return admitted{}, err
	}
	proj, err := s.deps.Projects.Access(ctx, p, t.ProjectID)
	switch {
	case err == nil && !proj.AtLeast(projectctx.RoleMember):
		// An app runs code as the allocation's user (a notebook is a shell), so, as for the
		// terminal and SSH, a viewer of the project may not use it.
		return admitted{}, apierr.Forbidden("viewers of a project cannot use its apps: they run code as the allocation's user")
	case err == nil:
		return admitted{p: p, target: t, project: t.ProjectID}, nil
	case apierr.CodeOf(err) != apierr.InsufficientPermissions:
		return admitted{}, err
	}
	if s.deps.Grants != nil {
		pid, ok, gerr := s.deps.Grants.ProxyGrant(ctx, p, t)
		if gerr != nil {
			return admitted{}, gerr
		}
		if ok {
			return admitted{p: p, target: t, project: pid}, nil
		}
	}
	if p.TenantID != uuid.Nil && p.TenantID == t.TenantID {
		return admitted{}, apierr.Forbidden("you are not a member of the app instance's project")
	}
	return admitted{}, apierr.New(apierr.AppInstanceNotFound, "app instance not found")
}

// proxy carries one request (or WebSocket) to the app.
func (s *Service) proxy(w http.ResponseWriter, r *http.Request, id uuid.UUID) {
	ctx := r.Context()
	p, byCookie, err := s.caller(r, id)
	if err != nil {
		s.deny(w, r, nil, err, byCookie)
		return
	}
	if e := s.limit(ctx, p); e != nil {
		s.metrics.requests.WithLabelValues("rate_limited").Inc()
		s.fail(w, r, e)
		return
	}
	a, cached := s.admitted.get(p, id, s.now())
	if !cached {
		if a, err = s.admit(ctx, p, id); err != nil {
			s.deny(w, r, p, err, byCookie)
			return
		}
		s.admitted.put(a, id, s.now())
	}
	t := a.target
	if t.State != StateRunning && t.State != StateUnhealthy {
		s.metrics.requests.WithLabelValues("not_running").Inc()
		s.fail(w, r, apierr.New(apierr.ServiceUnavailable, "the app instance is not running (%s)", t.State).
			With("reason", "app_instance_not_running").With("state", t.State).With("app_instance_id", id.String()))
		return
	}
	if t.Port < 1 || t.Port > 65535 {
		s.fail(w, r, apierr.New(apierr.ServiceUnavailable, "the app instance has no port yet").
			With("reason", "app_instance_not_running").With("state", t.State))
		return
	}
	upgrade := isUpgrade(r)
	var call *Call
	if s.deps.Meter != nil {
		// Metered in modifyResponse, once the app has answered (billable).
		call = &Call{Target: t, UserID: p.UserID, ProjectID: a.project, CallID: uuid.New(), WebSocket: upgrade, At: s.now()}
	}
	// A proxied body may take longer than the server's read timeout (a large upload, a
	// long download, a WebSocket): the app's own pace decides.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	rw := &trackingWriter{ResponseWriter: w, s: s}
	r = r.WithContext(withTarget(ctx, t, call))
	s.rp.ServeHTTP(rw, r)
	if upgrade && rw.hijacked {
		s.metrics.requests.WithLabelValues("websocket").Inc()
	} else if !rw.failed {
		s.metrics.requests.WithLabelValues("ok").Inc()
	}
}

// limit counts the request against the caller's app_proxy limit: per principal (a
// user, or a machine identity's own user row), whichever instance it calls, so one
// client cannot starve the replica by spreading over instances. It runs after
// authentication (a request without a valid principal is refused before it costs a
// store round trip) and before admission (which may read the database).
func (s *Service) limit(ctx context.Context, p *principal.Principal) *apierr.Error {
	if s.limitGroup.PerMinute <= 0 {
		return nil
	}
	return s.deps.Limiter.Check(ctx, s.limitGroup, "user:"+p.UserID.String())
}

func isUpgrade(r *http.Request) bool {
	for _, v := range r.Header.Values("Connection") {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "upgrade") {
				return r.Header.Get("Upgrade") != ""
			}
		}
	}
	return false
}

// deny answers an authentication or access failure; 401 and 403 are audited once.
func (s *Service) deny(w http.ResponseWriter, r *http.Request, p *principal.Principal, err error, byCookie bool) {
	e := routed(err, r)
	status := e.HTTPStatus()
	if status == http.StatusUnauthorized || status == http.StatusForbidden {
		den := audit.Denial{ActorType: audit.ActorUser, Route: Route, OperationID: operationID, Code: string(e.Code), Status: status}
		if p != nil {
			den.ActorUserID, den.TenantID = p.UserID, p.TenantID
		}
		audit.Deny(w, r, s.deps.Log, s.deps.Denials, den, bearer.InAuthorization(r) || byCookie)
		s.metrics.requests.WithLabelValues("denied").Inc()
	} else if status == http.StatusNotFound {
		s.metrics.requests.WithLabelValues("not_found").Inc()
	}
	envelopes.Write(w, r, e)
}

// fail answers an error envelope with the route and method in details.
func (s *Service) fail(w http.ResponseWriter, r *http.Request, err error) {
	e := routed(err, r)
	if e.Code == apierr.InternalError {
		s.deps.Log.ErrorContext(r.Context(), "app proxy: internal error", "err", err)
	}
	envelopes.Write(w, r, e)
}

func routed(err error, r *http.Request) *apierr.Error {
	e, ok := apierr.As(err)
	if !ok {
		e = apierr.Internal(err)
	}
	return e.With("route", Route).With("method", r.Method)
}

// Session is a minted exchange: the URL to open in the browser, once, before ExpiresAt.
type Session struct {
	InstanceID uuid.UUID
	URL        string
	ExpiresAt  time.Time
}

// Mint is createAppProxySession: the caller (authenticated, member or more in proj, which
// the server checked) gets a single-use code for an instance of proj that is running.
func (s *Service) Mint(ctx context.Context, p *principal.Principal, proj projectctx.Project, id uuid.UUID) (Session, error) {
	if p.Machine != nil {
		return Session{}, apierr.Forbidden("machine identities call the proxy with their bearer token; the exchange is for browsers").
			With("reason", "machine_identity")
	}
	if !proj.AtLeast(projectctx.RoleMember) { // the server's table says so too
		return Session{}, apierr.Forbidden("viewers of a project cannot use its apps: they run code as the allocation's user")
	}
	t, err := s.deps.Instances.ProxyTarget(ctx, id)
	if err != nil {
		return Session{}, err
	}
	if t.ProjectID != proj.ID {
		return Session{}, apierr.New(apierr.AppInstanceNotFound, "app instance not found")
	}
	if t.State != StateRunning && t.State != StateUnhealthy {
		return Session{}, apierr.New(apierr.AppInstanceStateInvalid, "the app instance is not running (%s)", t.State).
			With("state", t.State)
	}
	exp := s.now().Add(s.cfg.ExchangeTTL).Truncate(time.Millisecond)
	code, err := s.codes.mint(ctx, codeClaims{Instance: id.String(), User: p.UserID.String(), Tenant: p.TenantID.String(),
		TenantRole: p.TenantRole, Username: p.Username, Expires: exp.UnixMilli()})
	if err != nil {
		return Session{}, err
	}
	return Session{InstanceID: id, ExpiresAt: exp, URL: InstancePath(id) + "?" + CodeParam + "=" + code}, nil
}

// spendCode is the exchange: a GET of a proxy URL carrying a code spends it, sets the
// instance's cookie and redirects to the same URL without the code.
func (s *Service) spendCode(w http.ResponseWriter, r *http.Request, id uuid.UUID) {
	ctx := r.Context()
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		s.fail(w, r, apierr.New(apierr.InvalidRequest, "an exchange code is spent with GET").With("reason", "method_not_allowed").
			WithStatus(http.StatusMethodNotAllowed))
		return
	}
	q := r.URL.Query()
	code := q.Get(CodeParam)
	if code == "" {
		s.deny(w, r, nil, apierr.New(apierr.TokenMissing, "the exchange needs its code"), false)
		return
	}
	cl, err := s.codes.consume(ctx, code, s.deps.Clock.Now())
	if err != nil {
		if errors.Is(err, errCodeReplayed) {
			s.metrics.replays.Inc()
		}
		s.denyCode(w, r, cl, err)
		return
	}
	if cl.Instance != id.String() {
		s.denyCode(w, r, cl, apierr.New(apierr.TokenInvalid, "the exchange code is not valid").With("reason", "wrong_instance"))
		return
	}
	s.metrics.exchanged.Inc()
	user, err1 := uuid.Parse(cl.User)
	tenant, err2 := uuid.Parse(cl.Tenant)
	if err1 != nil || err2 != nil {
		s.denyCode(w, r, cl, apierr.New(apierr.TokenInvalid, "the exchange code is not valid"))
		return
	}
	p := &principal.Principal{UserID: user, TenantID: tenant, TenantRole: cl.TenantRole, Username: cl.Username}
	if _, err := s.admit(ctx, p, id); err != nil { // access may have changed since the mint
		s.deny(w, r, p, err, false)
		return
	}
	path := InstancePath(id)
	http.SetCookie(w, &http.Cookie{
		Name: CookieName, Value: s.signCookie(cookieClaims{Instance: cl.Instance, User: cl.User, Tenant: cl.Tenant,
			TenantRole: cl.TenantRole, Username: cl.Username, Expires: s.now().Add(s.cfg.CookieTTL).UnixMilli()}),
		Path: path, MaxAge: int(s.cfg.CookieTTL / time.Second), HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: secureRequest(r),
	})
	q.Del(CodeParam)
	loc := path + strings.TrimPrefix(r.URL.EscapedPath(), path)
	if enc := q.Encode(); enc != "" {
		loc += "?" + enc
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
		// A SameSite=Strict cookie is not sent along a redirect chain that a cross-site
		// navigation started: land on this site first, then move on from here.
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		u := html.EscapeString(loc)
		_, _ = fmt.Fprintf(w, "<!doctype html><meta http-equiv=\"refresh\" content=\"0;url=%s\"><a href=\"%s\">Open the app</a>\n", u, u)
		return
	}
	http.Redirect(w, r, loc, http.StatusSeeOther)
}

// denyCode answers a refused exchange code, audited as the code's owner when known.
func (s *Service) denyCode(w http.ResponseWriter, r *http.Request, cl codeClaims, err error) {
	var p *principal.Principal
	if u, uerr := uuid.Parse(cl.User); uerr == nil {
		t, _ := uuid.Parse(cl.Tenant)
		p = &principal.Principal{UserID: u, TenantID: t}
	}
	s.deny(w, r, p, err, true)
}

func secureRequest(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// reverseProxy builds the one httputil.ReverseProxy of the service: the request's
// context names its target (withTarget).
func (s *Service) reverseProxy() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Transport:      s.transport,
		BufferPool:     copyBuffers,
		Rewrite:        s.rewrite,
		ModifyResponse: s.modifyResponse,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if tw, ok := w.(*trackingWriter); ok {
				tw.failed = true
			}
			e := roundTripError(err)
			if ae, ok := apierr.As(err); ok {
				e = ae // modifyResponse's (a call the meter refused)
			}
			if errors.Is(e, context.Canceled) {
				return // the client went away
			}
			s.metrics.requests.WithLabelValues("upstream_error").Inc()
			s.fail(w, r, e)
		},
		ErrorLog: nil,
	}
}

func (s *Service) rewrite(pr *httputil.ProxyRequest) {
	t, _ := targetOf(pr.In.Context())
	prefix := strings.TrimSuffix(InstancePath(t.InstanceID), "/")
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = appHost(t)
	if !t.KeepPrefix {
		out.URL.Path = strings.TrimPrefix(pr.In.URL.Path, prefix)
		if pr.In.URL.RawPath != "" {
			out.URL.RawPath = strings.TrimPrefix(pr.In.URL.RawPath, prefix)
		}
		if out.URL.Path == "" {
			out.URL.Path = "/"
		}
	}
	pr.SetXForwarded()
	// The app listens on loopback and sees its own address as the host (apps that guard
	// against DNS rebinding, Jupyter among them, accept nothing else); the browser's
	// host is in X-Forwarded-Host.
	local := "127.0.0.1:" + strconv.Itoa(t.Port)
	out.Host = local
	out.Header.Set("X-Forwarded-Prefix", prefix)
	if o := pr.In.Header.Get("Origin"); o != "" && sameOrigin(o, pr.In) {
		out.Header.Set("Origin", "http://"+local)
	}
	// The user's credentials for Gantry are never the app's business.
	out.Header.Del("Authorization")
	out.Header.Del("Proxy-Authorization")
	filterCookies(out.Header)
}

// sameOrigin reports whether origin is the request's own (scheme and host).
func sameOrigin(origin string, r *http.Request) bool {
	u, err := url.Parse(origin)
	if err != nil {
		return false
	}
	scheme := "http"
	if secureRequest(r) {
		scheme = "https"
	}
	return strings.EqualFold(u.Host, r.Host) && u.Scheme == scheme
}

// filterCookies drops Gantry's cookies (the proxy's own and any named gantry*) and
// keeps the app's (which modifyResponse scoped to the instance's path).
func filterCookies(h http.Header) {
	vals := h.Values("Cookie")
	if len(vals) == 0 {
		return
	}
	var keep []string
	for _, v := range vals {
		for _, part := range strings.Split(v, ";") {
			part = strings.TrimSpace(part)
			name, _, _ := strings.Cut(part, "=")
			if part == "" || isGantryCookie(name) {
				continue
			}
			keep = append(keep, part)
		}
	}
	h.Del("Cookie")
	if len(keep) > 0 {
		h.Set("Cookie", strings.Join(keep, "; "))
	}
}

func isGantryCookie(name string) bool {
	n := strings.ToLower(strings.TrimSpace(name))
	return strings.HasPrefix(n, "gantry") || strings.HasPrefix(n, "__host-gantry") || strings.HasPrefix(n, "__secure-gantry")
}

// modifyResponse meters the call the app answered and keeps the app inside its proxy
// path: redirects and cookies that name "/" mean the instance's path, and the app may
// not set Gantry's cookies.
func (s *Service) modifyResponse(resp *http.Response) error {
	rt, _ := resp.Request.Context().Value(targetKey{}).(proxied)
	t := rt.target
	if rt.call != nil && Billable(resp.StatusCode) {
		// A refusal (the project was detached meanwhile) withholds the app's answer: a
		// call is never served unpaid. The ErrorHandler writes the envelope.
		if err := s.deps.Meter.ProxiedCall(resp.Request.Context(), *rt.call); err != nil {
			return err
		}
	}
	prefix := strings.TrimSuffix(InstancePath(t.InstanceID), "/")
	if loc := resp.Header.Get("Location"); loc != "" {
		resp.Header.Set("Location", rewriteLocation(loc, prefix, t))
	}
	if sc := resp.Header.Values("Set-Cookie"); len(sc) > 0 {
		resp.Header.Del("Set-Cookie")
		for _, v := range sc {
			if nv, ok := rewriteSetCookie(v, prefix, t.KeepPrefix); ok {
				resp.Header.Add("Set-Cookie", nv)
			}
		}
	}
	return nil
}

func rewriteLocation(loc, prefix string, t Target) string {
	u, err := url.Parse(loc)
	if err != nil {
		return loc
	}
	if u.Host != "" {
		h := u.Hostname()
		if h != "127.0.0.1" && h != "localhost" && h != "::1" {
			return loc // another site: the app's business
		}
		u.Scheme, u.Host, u.User = "", "", nil
	}
	if !strings.HasPrefix(u.Path, "/") || (t.KeepPrefix && strings.HasPrefix(u.Path, prefix+"/")) {
		return u.String() // relative, or already under the prefix
	}
	if !t.KeepPrefix || !strings.HasPrefix(u.Path, prefix) {
		u.Path = prefix + u.Path
		if u.RawPath != "" {
			u.RawPath = prefix + u.RawPath
		}
	}
	return u.String()
}

func rewriteSetCookie(v, prefix string, keepPrefix bool) (string, bool) {
	parts := strings.Split(v, ";")
	name, _, _ := strings.Cut(strings.TrimSpace(parts[0]), "=")
	if isGantryCookie(name) {
		return "", false
	}
	out := []string{strings.TrimSpace(parts[0])}
	path := "/"
	for _, p := range parts[1:] {
		p = strings.TrimSpace(p)
		k, val, _ := strings.Cut(p, "=")
		switch strings.ToLower(k) {
		case "domain":
			continue // host-only: this control plane's host
		case "path":
			path = val
			continue
		}
		out = append(out, p)
	}
	if !strings.HasPrefix(path, "/") {
		path = "/"
	}
	if !(keepPrefix && strings.HasPrefix(path, prefix+"/")) && path != prefix {
		path = prefix + path
	}
	return strings.Join(append(out, "Path="+path), "; "), true
}
