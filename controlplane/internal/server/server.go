package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/gantry-gpu/gantry/controlplane/internal/audit"
	"github.com/gantry-gpu/gantry/controlplane/internal/auth"
	"github.com/gantry-gpu/gantry/controlplane/internal/authz"
	"github.com/gantry-gpu/gantry/controlplane/internal/contract"
	"github.com/gantry-gpu/gantry/controlplane/internal/fleet"
	"github.com/gantry-gpu/gantry/controlplane/internal/idempotency"
	"github.com/gantry-gpu/gantry/controlplane/internal/metrics"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/controlplane/internal/projectctx"
	"github.com/gantry-gpu/gantry/controlplane/internal/ratelimit"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
	"github.com/gantry-gpu/gantry/shared/correlation"
)

// ServiceName goes into every envelope's details.service.
const ServiceName = "gantry-controlplane"

// DefaultMaxBodyBytes caps request bodies (1 MiB): every JSON body of the contract is
// far smaller, and the cap stops a client from making the validator buffer gigabytes.
const DefaultMaxBodyBytes = 1 << 20

// Authenticator verifies the bearer JWT of a request.
type Authenticator interface {
	Authenticate(r *http.Request) (*principal.Principal, error)
}

// ProjectAccess resolves the caller's role in a project; a non-member gets
// insufficient_permissions.
type ProjectAccess interface {
	Access(ctx context.Context, p *principal.Principal, projectID uuid.UUID) (projectctx.Project, error)
}

// BucketGrants admits, to the storage operations declared authz.ProjectRoleOrGrant,
// callers whose role in the project X-Project-ID names does not cover the operation but
// who hold a grant on the bucket in the path (storage.Service.GrantedProject). member is
// the caller's project context when they are a member (zero otherwise); the answer is
// the project context to act in, with Grant set when a grant applies, or the error to
// answer (a caller with neither role nor grant is told the bucket does not exist).
type BucketGrants interface {
	GrantedProject(ctx context.Context, p *principal.Principal, projectID uuid.UUID, bucketID string, member projectctx.Project) (projectctx.Project, error)
}

// NodeAuthenticator verifies an opaque node bearer token (security nodeBearerAuth):
// fleet.Directory's AuthenticateNode. fleet.ErrUnauthenticated means the token is not
// accepted; any other error is an infrastructure failure (503).
type NodeAuthenticator interface {
	AuthenticateNode(ctx context.Context, token string) (uuid.UUID, error)
}

// Deps is everything the HTTP surface needs.
type Deps struct {
	Logger   *slog.Logger
	Contract *contract.Contract
	API      api.StrictServerInterface
	Auth     Authenticator
	// NodeAuth authenticates node-facing operations; nil refuses every node token.
	NodeAuth NodeAuthenticator
	Projects ProjectAccess
	// Grants admits grantees of a storage bucket (nil: only members).
	Grants       BucketGrants
	Idempotency  *idempotency.Store
	Limiter      *ratelimit.Limiter
	Metrics      *metrics.API
	Tracer       trace.TracerProvider
	MaxBodyBytes int64
	// Denials aggregates every 401 and 403 into the audit log; nil audits none.
	Denials *audit.Denials
	// AuthzDenied, when set, is told of every refusal by the operation's declared
	// requirement (per-feature denial counters, e.g. api_platform_role_admin_denied_total).
	AuthzDenied func(operationID string, err error)
	// RequestTimeout is every operation's deadline but the WebSocket ones
	// (GANTRY_REQUEST_TIMEOUT); 0 is DefaultRequestTimeout, negative none.
	RequestTimeout time.Duration
	// StrictMiddlewares run around every generated handler (features that need the raw
	// request, such as the internal-token check of the JWKS refresh, hook in here).
	StrictMiddlewares []api.StrictMiddlewareFunc
}

type server struct {
	Deps
	mux       *chi.Mux
	errors    errorMapper
	deadlines deadlines
}

// New builds the control plane's HTTP handler.
func New(d Deps) http.Handler {
	if d.MaxBodyBytes <= 0 {
		d.MaxBodyBytes = DefaultMaxBodyBytes
	}
	s := &server{Deps: d, mux: chi.NewRouter(), deadlines: newDeadlines(d.Contract, d.RequestTimeout)}
	s.errors = errorMapper{writer: apierr.Writer{Service: ServiceName}, log: d.Logger,
		denials: &denials{audit: d.Denials, mux: s.mux, contract: d.Contract}}
	if s.Limiter != nil {
		s.Limiter.Errors = s.errors.writer
	}

	s.mux.Use(
		recoverer(s.errors, d.Logger),
		correlation.Middleware,
		correlation.Tracing(d.Tracer, ServiceName),
		d.Metrics.Middleware,
	)
	if d.Limiter != nil {
		s.mux.Use(d.Limiter.Middleware)
	}
	s.mux.Use(s.operation)
	s.mux.NotFound(func(w http.ResponseWriter, r *http.Request) { notFound(w, r, s.errors) })
	s.mux.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) { methodNotAllowed(w, r, s.errors) })

	strict := api.NewStrictHandlerWithOptions(d.API, d.StrictMiddlewares, api.StrictHTTPServerOptions{
		RequestErrorHandlerFunc:  s.errors.bodyError,
		ResponseErrorHandlerFunc: s.errors.write,
	})
	api.HandlerWithOptions(strict, api.ChiServerOptions{BaseRouter: s.mux, ErrorHandlerFunc: s.errors.paramError})
	return s.mux
}

// Routes lists the chi routes (method, pattern) for the conformance test.
func Routes(h http.Handler) ([][2]string, error) {
	mux, ok := h.(*chi.Mux)
	if !ok {
		return nil, errors.New("not a chi mux")
	}
	var out [][2]string
	err := chi.Walk(mux, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		out = append(out, [2]string{method, route})
		return nil
	})
	return out, err
}

// operation runs the route-aware part of the chain. It finds the operation before the
// generated wrapper binds parameters, so authentication, project context and the
// operation's declared requirement (authz.Operations) come first (ARCHITECTURE §3)
// whatever is wrong with the parameters or the body.
func (s *server) operation(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rctx := chi.NewRouteContext()
		path := r.URL.RawPath
		if path == "" {
			path = r.URL.Path
		}
		op := s.Contract.Op(r.Method, s.mux.Find(rctx, r.Method, path))
		if op == nil {
			next.ServeHTTP(w, r) // chi answers 404 / 405
			return
		}
		base := r.Context()
		ctx, cancel := s.deadlines.apply(base, op)
		defer cancel()

		if op.Security == contract.SecurityBearer {
			p, err := s.Auth.Authenticate(r)
			if err != nil {
				s.errors.write(w, r, err)
				return
			}
			ctx = principal.With(ctx, p)
		}
		if op.Security == contract.SecurityNode {
			n, err := s.authenticateNode(ctx, r)
			if err != nil {
				s.errors.write(w, r, err)
				return
			}
			ctx = principal.WithNode(ctx, n)
		}

		if op.ProjectHeader || op.ProjectPath {
			proj, err := s.projectContext(ctx, r, op, rctx)
			if req := authz.For(op.ID); req.Kind == authz.KindProjectRoleOrGrant {
				proj, err = s.grantContext(ctx, r, rctx, req, proj, err)
			}
			if err != nil {
				s.errors.write(w, r.WithContext(ctx), err) // with the principal: the denial is audited as theirs
				return
			}
			if proj.ID != uuid.Nil { // an optional header that was not sent
				ctx = projectctx.With(ctx, proj)
			}
		}
		if ctx != base { // each WithContext copies the request; only streaming GETs add nothing
			r = r.WithContext(ctx)
		}

		// Authorization before anything about the request is read: a caller who may not
		// call the operation gets its 403 (audited by the mapper), never a validation
		// error naming the schema's fields (docs/api.md, "Authorization").
		if err := authz.For(op.ID).Check(ctx); err != nil {
			if s.AuthzDenied != nil {
				s.AuthzDenied(op.ID, err)
			}
			s.errors.write(w, r, err)
			return
		}

		key, err := idempotency.CheckKey(r)
		if err != nil {
			s.errors.write(w, r, err)
			return
		}

		if op.Streams { // the handler reads the body as it arrives (contract.Op.Streams)
			if err := op.ValidateRequest(ctx, r, urlParams(rctx)); err != nil {
				s.errors.write(w, r, err)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		body, err := s.readBody(w, r)
		if err != nil {
			s.errors.write(w, r, err)
			return
		}
		if err := op.ValidateRequest(ctx, r, urlParams(rctx)); err != nil {
			s.errors.write(w, r, err)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))

		if op.Idempotent && key != "" {
			if p, ok := principal.From(ctx); ok {
				scope := idempotency.Scope{Principal: p.Key(), Method: r.Method, Route: op.Path, Key: key}
				s.Idempotency.Serve(w, r, scope, body, next, s.errors.write)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// authenticateNode checks the node bearer token of a node-facing operation: none is
// token_missing, one that is malformed, unknown, revoked or rotated away token_invalid
// (without saying which).
func (s *server) authenticateNode(ctx context.Context, r *http.Request) (*principal.Node, error) {
	token, found, err := auth.BearerToken(r)
	if err != nil || (found && token == "") {
		return nil, apierr.New(apierr.TokenInvalid, "node token is not valid")
	}
	if !found {
		return nil, apierr.New(apierr.TokenMissing, "node token required")
	}
	if s.NodeAuth == nil {
		return nil, apierr.New(apierr.TokenInvalid, "node token is not valid")
	}
	id, err := s.NodeAuth.AuthenticateNode(ctx, token)
	if errors.Is(err, fleet.ErrUnauthenticated) {
		return nil, apierr.New(apierr.TokenInvalid, "node token is not valid")
	}
	if err != nil {
		return nil, apierr.New(apierr.ServiceUnavailable, "node authentication is unavailable").Wrap(err)
	}
	return &principal.Node{ID: id, Token: token}, nil
}

// readBody reads the capped body and leaves a fresh reader on r for the validator.
func (s *server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, apierr.New(apierr.InvalidRequest, "request body is larger than %d bytes", s.MaxBodyBytes).
				With("field", "body").With("reason", "body_too_large").WithStatus(http.StatusRequestEntityTooLarge)
		}
		return nil, apierr.New(apierr.InvalidRequest, "request body could not be read").Wrap(err)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, nil
}

// projectContext applies the rules of seed §4.1: the path wins when it carries the
// project, a header that disagrees with it is refused, a required header must be sent,
// and the caller must be a member.
func (s *server) projectContext(ctx context.Context, r *http.Request, op *contract.Op, rctx *chi.Context) (projectctx.Project, error) {
	header := strings.TrimSpace(r.Header.Get("X-Project-ID"))
	var raw string
	switch {
	case op.ProjectPath:
		raw = rctx.URLParam("project_id")
		if header != "" {
			hid, herr := uuid.Parse(header)
			pid, perr := uuid.Parse(raw)
			if herr != nil || perr != nil || hid != pid {
				return projectctx.Project{}, apierr.New(apierr.InvalidRequest, "X-Project-ID does not match the project in the path").
					With("field", "X-Project-ID").With("reason", "project_context_mismatch")
			}
		}
	case header == "":
		if !op.HeaderRequired {
			return projectctx.Project{}, nil
		}
		return projectctx.Project{}, missingProject()
	default:
		raw = header
	}
	id, err := uuid.Parse(raw)
	if err != nil {
		field := "X-Project-ID"
		if op.ProjectPath {
			field = "project_id"
		}
		return projectctx.Project{}, apierr.New(apierr.InvalidRequest, "%s is not a valid project id", field).With("field", field)
	}
	p, ok := principal.From(ctx)
	if !ok {
		return projectctx.Project{}, apierr.New(apierr.TokenMissing, "authentication required")
	}
	return s.Projects.Access(ctx, p, id)
}

// grantContext lets a storage grant stand in for a project role the caller lacks
// (authz.ProjectRoleOrGrant): a non-member (insufficient_permissions from the project
// check) or a member whose role is too weak is resolved by the storage service against
// the bucket in the path. Other errors (no or malformed header, a database failure)
// are answered as they are.
func (s *server) grantContext(ctx context.Context, r *http.Request, rctx *chi.Context, req authz.Requirement,
	proj projectctx.Project, err error) (projectctx.Project, error) {
	if s.Grants == nil {
		return proj, err
	}
	switch {
	case err == nil && proj.AtLeast(req.Role):
		return proj, nil
	case err != nil && apierr.CodeOf(err) != apierr.InsufficientPermissions:
		return proj, err
	case err != nil:
		proj = projectctx.Project{}
	}
	p, ok := principal.From(ctx)
	if !ok {
		return projectctx.Project{}, apierr.New(apierr.TokenMissing, "authentication required")
	}
	id, perr := uuid.Parse(strings.TrimSpace(r.Header.Get("X-Project-ID")))
	if perr != nil {
		return projectctx.Project{}, apierr.New(apierr.InvalidRequest, "X-Project-ID is not a valid project id").With("field", "X-Project-ID")
	}
	bucket := rctx.URLParam("bucket_id")
	if raw, uerr := url.PathUnescape(bucket); uerr == nil {
		bucket = raw
	}
	return s.Grants.GrantedProject(ctx, p, id, bucket, proj)
}

// urlParams are the route's path parameters, decoded: routing matches the escaped
// path (so a bucket_id may carry an escaped "/"), and the validator checks the value
// the handler will get.
func urlParams(rctx *chi.Context) map[string]string {
	out := make(map[string]string, len(rctx.URLParams.Keys))
	for i, k := range rctx.URLParams.Keys {
		v := rctx.URLParams.Values[i]
		if raw, err := url.PathUnescape(v); err == nil {
			v = raw
		}
		out[k] = v
	}
	return out
}
