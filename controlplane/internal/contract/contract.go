// Package contract loads the embedded REST contract (proto/openapi/openapi.yaml) once
// and answers, for each routed operation, what the request chain must do: which security
// scheme applies, where the project context comes from, whether the operation is an
// idempotent create, and whether a request conforms (kin-openapi). Tests use the same
// document to check every response they receive.
package contract

import (
	"context"
	"net/http"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	"github.com/gantry-gpu/gantry/proto/openapi"
)

func init() {
	// The contract document is served as application/yaml and declared as a string: the
	// validator must take the body as raw text, not parse it as YAML.
	openapi3filter.RegisterBodyDecoder("application/yaml", openapi3filter.FileBodyDecoder)
}

// Security is the authentication an operation requires.
type Security int

const (
	SecurityNone Security = iota
	SecurityBearer
	SecurityNode
	SecurityInternalToken
)

// Op is what the chain knows about one operation.
type Op struct {
	ID       string
	Method   string
	Path     string // the contract's path template, which is also the chi pattern
	Security Security
	// ProjectHeader: the operation declares X-Project-ID; HeaderRequired: it must be sent.
	ProjectHeader  bool
	HeaderRequired bool
	// ProjectPath: the path carries {project_id}.
	ProjectPath bool
	// Idempotent: the operation accepts Idempotency-Key (a create).
	Idempotent bool
	// Streams: the request or a success response body is binary of any length (object
	// uploads and downloads). The chain neither
	// buffers nor validates such a body and gives the request no deadline: the handler
	// bounds its own steps and reads the body as it arrives.
	Streams bool
	// paramsNeedCheck: the operation has path or header parameters that only the
	// validator checks (anything but uuid path ids and the chain's own headers).
	paramsNeedCheck bool
	route           *routers.Route
}

// Contract is the loaded document and its operation table.
type Contract struct {
	Doc *openapi3.T
	ops map[string]*Op // key: METHOD + " " + path template
}

// Load parses and validates the embedded document.
func Load() (*Contract, error) {
	// openapi.Load also registers a uuid format that accepts UUIDv7.
	doc, err := openapi.Load(context.Background())
	if err != nil {
		return nil, err
	}
	c := &Contract{Doc: doc, ops: map[string]*Op{}}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			o := &Op{ID: op.OperationID, Method: method, Path: path, ProjectPath: strings.Contains(path, "{project_id}")}
			o.Security = securityOf(doc, op)
			o.Streams = streams(op)
			for _, p := range op.Parameters {
				if p.Value == nil {
					continue
				}
				switch {
				case p.Value.In == "header" && strings.EqualFold(p.Value.Name, "X-Project-ID"):
					o.ProjectHeader = true
					o.HeaderRequired = p.Value.Required
				case p.Value.In == "header" && strings.EqualFold(p.Value.Name, "Idempotency-Key"):
					o.Idempotent = true
				case p.Value.In == "header" && strings.EqualFold(p.Value.Name, "X-Request-Id"):
					// The correlation middleware has already replaced a bad one.
				case p.Value.In == "path" && isUUID(p.Value.Schema):
					// The generated wrapper parses it and answers a malformed one.
				case p.Value.In == "query":
					// Checked whenever a query string is present.
				default:
					o.paramsNeedCheck = true
				}
			}
			o.route = &routers.Route{Spec: doc, Path: path, PathItem: item, Method: method, Operation: op}
			c.ops[method+" "+path] = o
		}
	}
	return c, nil
}

// MustLoad is Load for program start-up and tests.
func MustLoad() *Contract {
	c, err := Load()
	if err != nil {
		panic(err)
	}
	return c
}

func securityOf(doc *openapi3.T, op *openapi3.Operation) Security {
	reqs := doc.Security
	if op.Security != nil {
		reqs = *op.Security
	}
	for _, req := range reqs {
		for name := range req {
			switch name {
			case "bearerAuth":
				return SecurityBearer
			case "nodeBearerAuth":
				return SecurityNode
			case "internalTokenAuth":
				return SecurityInternalToken
			}
		}
	}
	return SecurityNone
}

// Op is the operation routed at method + chi pattern, or nil.
func (c *Contract) Op(method, pattern string) *Op { return c.ops[method+" "+pattern] }

// Ops lists every operation of the contract.
func (c *Contract) Ops() []*Op {
	out := make([]*Op, 0, len(c.ops))
	for _, o := range c.ops {
		out = append(out, o)
	}
	return out
}

// Route is the kin-openapi route of an operation (for response validation in tests).
func (o *Op) Route() *routers.Route { return o.route }

// needsValidation reports whether the validator has anything to check; a plain GET
// without a query string (the common case) skips it entirely.
func (o *Op) needsValidation(r *http.Request) bool {
	return r.URL.RawQuery != "" || r.ContentLength != 0 || o.paramsNeedCheck || o.route.Operation.RequestBody != nil
}

// streams reports an operation whose request or success response body is declared as
// binary of any length (schema type string, format binary), the object upload and
// download. A body declared without a schema (the payment webhooks' */*) is not one:
// it stays capped and buffered like every JSON body.
// maxDocumentBytes bounds a binary body that is a document rather than a stream.
const maxDocumentBytes = 64 << 20

func streams(op *openapi3.Operation) bool {
	has := func(c openapi3.Content) bool {
		for _, mt := range c {
			// A binary bounded to a document's size (an invoice PDF, maxLength <= 64 MiB) is
			// rendered and sent within the request deadline; only unbounded ones stream.
			if mt != nil && mt.Schema != nil && mt.Schema.Value != nil && mt.Schema.Value.Format == "binary" &&
				(mt.Schema.Value.MaxLength == nil || *mt.Schema.Value.MaxLength > maxDocumentBytes) {
				return true
			}
		}
		return false
	}
	if op.RequestBody != nil && op.RequestBody.Value != nil && has(op.RequestBody.Value.Content) {
		return true
	}
	if op.Responses != nil {
		for status, r := range op.Responses.Map() {
			if strings.HasPrefix(status, "2") && r.Value != nil && has(r.Value.Content) {
				return true
			}
		}
	}
	return false
}

func isUUID(s *openapi3.SchemaRef) bool {
	return s != nil && s.Value != nil && s.Value.Format == "uuid"
}
