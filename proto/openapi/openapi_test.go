package openapi_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/gantry-gpu/gantry/proto/openapi"
)

const (
	schemasPrefix      = "#/components/schemas/"
	responsesPrefix    = "#/components/responses/"
	errorResponseRef   = schemasPrefix + "ErrorResponse"
	xRequestIDParamRef = "#/components/parameters/XRequestId"
	xRequestIDHeadRef  = "#/components/headers/XRequestId"
	xProjectIDParamRef = "#/components/parameters/XProjectId"
	idempotencyKeyRef  = "#/components/parameters/IdempotencyKey"
)

// internalTokenOperations are the operations authenticated by an opaque internal token.
var internalTokenOperations = map[string]bool{
	"refreshJWKS": true, "receiveAlertNotification": true, "listNodeMetricsTargets": true, "getNodeMetrics": true,
}

// freeForm lists every place where the contract deliberately accepts any properties
// (`additionalProperties: true`). Everything else that is an object is closed.
var freeForm = map[string]bool{
	schemasPrefix + "ErrorResponse/properties/details":                       true,
	schemasPrefix + "BillingInvoiceSummary/properties/tax_snapshot":          true,
	schemasPrefix + "BillingInvoiceDetail/properties/tax_snapshot":           true,
	schemasPrefix + "BillingInvoiceLine/properties/tax_evidence":             true,
	schemasPrefix + "BillingTaxProfile/properties/tax_evidence":              true,
	schemasPrefix + "BillingRatedUsageLine/properties/pricing_snapshot":      true,
	schemasPrefix + "BillingShadowRatingRequest/properties/pricing_snapshot": true,
	schemasPrefix + "BillingShadowRatingLine/properties/pricing_snapshot":    true,
	schemasPrefix + "JWKSet/properties/keys/items":                           true,
	schemasPrefix + "AuditEvent/properties/metadata":                         true,
	// Alertmanager's webhook carries label and annotation maps (observability receiver).
	schemasPrefix + "AlertmanagerNotification/properties/groupLabels":       true,
	schemasPrefix + "AlertmanagerNotification/properties/commonLabels":      true,
	schemasPrefix + "AlertmanagerNotification/properties/commonAnnotations": true,
	schemasPrefix + "AlertmanagerNotificationAlert/properties/labels":       true,
	schemasPrefix + "AlertmanagerNotificationAlert/properties/annotations":  true,
}

// publicOperations are the operations that declare `security: []`.
var publicOperations = map[string]bool{
	"getHealth": true, "getReadiness": true, "getOpenAPIDocument": true, "getMetrics": true,
	"signup": true, "login": true, "refreshToken": true, "getJWKS": true,
	// Authenticated by the provider's signature over the body, not by a bearer token.
	"receivePaymentWebhook": true,
	// The one-time enrollment token in the body is the credential.
	"enrollNode": true,
	// The client-credentials grant: the client id and secret are the credential.
	"issueAccessToken": true,
	// Enterprise sign-in (OIDC): the browser is not signed in yet; the provider's code,
	// the single-use state and the flow cookie are the credential.
	"startOIDCSignIn": true, "finishOIDCSignIn": true,
	// The node agent's Debian package and its checksum, fetched by cloud-init on a machine
	// MAAS is deploying (before it has any credential); they hold no secret.
	"getNodeAgentPackage": true, "getNodeAgentPackageChecksum": true,
}

// nonEnvelopeErrors are error statuses whose body is deliberately not the ErrorResponse.
var nonEnvelopeErrors = map[string]bool{
	"getReadiness 503": true, // the ReadinessResponse naming the failing check
	// RFC 6749 section 5.2 errors of the client-credentials grant.
	"issueAccessToken 400": true, "issueAccessToken 401": true, "issueAccessToken 429": true,
}

// seedTags is the tag list of seed section 1.
var seedTags = []string{"Health", "Auth", "Users", "Projects", "SshKeys", "Billing", "Payments", "Catalog",
	"Nodes", "Allocations", "AllocationGroups", "Storage", "Apps", "AppArtifacts", "V3ReadModels",
	"PlatformReleases", "ServiceAccounts", "ProjectAccessCredentials", "AdminUsers", "AdminRoles",
	"AdminAccessCredentials", "AdminMaasSites", "AdminMaasLifecycle", "AdminNodes", "AdminSkus",
	"AdminOSImages", "AdminApps", "AdminAllocations", "AdminAudit", "AdminPayments", "AdminOps",
	"InternalNodes", "InternalAppProxy"}

// uuidPathParams are the path parameters seed section 4.1 declares as uuid.
var uuidPathParams = map[string]bool{
	"allocation_id": true, "allocation_group_id": true, "user_id": true, "tenant_id": true,
	"id": true, "profile_id": true, "credential_id": true, "onboarding_id": true,
	"decommission_id": true, "image_id": true, "project_id": true, "org_id": true,
	"service_account_id": true, "app_instance_id": true, "task_id": true, "member_id": true,
	"operation_id": true, "repair_operation_id": true, "shared_runtime_id": true,
	"attachment_id": true, "worker_id": true, "artifact_id": true, "key_id": true, "grant_id": true,
	"department_id": true,
}

func load(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

func TestDocumentValidates(t *testing.T) {
	doc := load(t)
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if doc.OpenAPI != "3.0.3" {
		t.Errorf("openapi = %q, want 3.0.3", doc.OpenAPI)
	}
	if doc.Info.Version != "1.0.0-draft" {
		t.Errorf("info.version = %q, want 1.0.0-draft", doc.Info.Version)
	}
	if doc.Info.Title != "Gantry control plane API" {
		t.Errorf("info.title = %q", doc.Info.Title)
	}
	var tags []string
	for _, tag := range doc.Tags {
		tags = append(tags, tag.Name)
	}
	if strings.Join(tags, ",") != strings.Join(seedTags, ",") {
		t.Errorf("tags = %v, want the seed's %v", tags, seedTags)
	}
	for _, name := range []string{"bearerAuth", "nodeBearerAuth", "internalTokenAuth"} {
		ss := doc.Components.SecuritySchemes[name]
		if ss == nil || ss.Value.Type != "http" || ss.Value.Scheme != "bearer" {
			t.Errorf("securityScheme %s must be http bearer", name)
		}
	}
	if len(doc.Security) != 1 || doc.Security[0]["bearerAuth"] == nil {
		t.Errorf("global security must be bearerAuth, got %v", doc.Security)
	}
}

// walkSchema visits ref's schema and every schema inlined in it; a $ref is not followed
// (its component is walked on its own).
func walkSchema(path string, ref *openapi3.SchemaRef, visit func(string, *openapi3.Schema)) {
	if ref == nil || ref.Ref != "" || ref.Value == nil {
		return
	}
	s := ref.Value
	visit(path, s)
	names := make([]string, 0, len(s.Properties))
	for name := range s.Properties {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		walkSchema(path+"/properties/"+name, s.Properties[name], visit)
	}
	walkSchema(path+"/items", s.Items, visit)
	walkSchema(path+"/additionalProperties", s.AdditionalProperties.Schema, visit)
	walkSchema(path+"/not", s.Not, visit)
	for i, sub := range s.AllOf {
		walkSchema(fmt.Sprintf("%s/allOf/%d", path, i), sub, visit)
	}
	for i, sub := range s.OneOf {
		walkSchema(fmt.Sprintf("%s/oneOf/%d", path, i), sub, visit)
	}
	for i, sub := range s.AnyOf {
		walkSchema(fmt.Sprintf("%s/anyOf/%d", path, i), sub, visit)
	}
}

// walkAll visits every schema of the document: components and the ones inlined in
// parameters, request bodies and responses.
func walkAll(doc *openapi3.T, visit func(string, *openapi3.Schema)) {
	names := make([]string, 0, len(doc.Components.Schemas))
	for name := range doc.Components.Schemas {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		walkSchema(schemasPrefix+name, doc.Components.Schemas[name], visit)
	}
	for name, p := range doc.Components.Parameters {
		walkSchema("#/components/parameters/"+name+"/schema", p.Value.Schema, visit)
	}
	for name, h := range doc.Components.Headers {
		walkSchema("#/components/headers/"+name+"/schema", h.Value.Schema, visit)
	}
	for name, r := range doc.Components.Responses {
		for ct, mt := range r.Value.Content {
			walkSchema("#/components/responses/"+name+"/content/"+ct+"/schema", mt.Schema, visit)
		}
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			at := fmt.Sprintf("%s %s", method, path)
			for _, p := range op.Parameters {
				if p.Ref == "" {
					walkSchema(at+" parameter "+p.Value.Name, p.Value.Schema, visit)
				}
			}
			if op.RequestBody != nil && op.RequestBody.Ref == "" {
				for ct, mt := range op.RequestBody.Value.Content {
					walkSchema(at+" requestBody "+ct, mt.Schema, visit)
				}
			}
			for code, r := range op.Responses.Map() {
				if r.Ref != "" {
					continue
				}
				for ct, mt := range r.Value.Content {
					walkSchema(at+" response "+code+" "+ct, mt.Schema, visit)
				}
			}
		}
	}
}

func TestObjectsAreClosedAndInputsBounded(t *testing.T) {
	doc := load(t)
	seenFreeForm := map[string]bool{}
	walkAll(doc, func(path string, s *openapi3.Schema) {
		switch {
		case s.Type == nil || s.Type.IsEmpty():
			// Only the OpenAPI 3.0 spelling of a nullable reference has no type.
			if !(len(s.AllOf) == 1 && s.AllOf[0].Ref != "" && s.Nullable) {
				t.Errorf("%s: schema without type (only `allOf: [$ref], nullable: true` may omit it)", path)
			}
		case s.Type.Is(openapi3.TypeObject):
			has := s.AdditionalProperties.Has
			switch {
			case s.AdditionalProperties.Schema != nil:
				t.Errorf("%s: typed additionalProperties are not used by this contract", path)
			case has == nil:
				t.Errorf("%s: object must declare additionalProperties (false, or true when free-form)", path)
			case *has:
				seenFreeForm[path] = true
				if !freeForm[path] {
					t.Errorf("%s: additionalProperties: true but not a documented free-form object", path)
				}
				if len(s.Properties) != 0 {
					t.Errorf("%s: a free-form object declares no properties", path)
				}
				if s.Description == "" {
					t.Errorf("%s: a free-form object must be documented (description)", path)
				}
			}
		case s.Type.Is(openapi3.TypeString):
			if len(s.Enum) == 0 && s.MaxLength == nil {
				t.Errorf("%s: string without maxLength", path)
			}
		case s.Type.Is(openapi3.TypeArray):
			if s.MaxItems == nil {
				t.Errorf("%s: array without maxItems", path)
			}
		}
	})
	for path := range freeForm {
		if !seenFreeForm[path] {
			t.Errorf("%s: listed as free-form but is not (or no longer exists)", path)
		}
	}
}

func TestOperations(t *testing.T) {
	doc := load(t)
	errorResponses := map[string]bool{}
	for name, r := range doc.Components.Responses {
		if mt := r.Value.Content.Get("application/json"); mt != nil && mt.Schema != nil && mt.Schema.Ref == errorResponseRef {
			errorResponses[responsesPrefix+name] = true
		}
	}
	seen := map[string]string{}
	for _, path := range doc.Paths.InMatchingOrder() {
		item := doc.Paths.Value(path)
		for method, op := range item.Operations() {
			at := fmt.Sprintf("%s %s (%s)", method, path, op.OperationID)
			if op.OperationID == "" {
				t.Errorf("%s: no operationId", at)
				continue
			}
			if prev, dup := seen[op.OperationID]; dup {
				t.Errorf("%s: operationId also used by %s", at, prev)
			}
			seen[op.OperationID] = at
			if len(op.Tags) != 1 || !contains(seedTags, op.Tags[0]) {
				t.Errorf("%s: want exactly one seed tag, got %v", at, op.Tags)
			}

			params := map[string]bool{}
			var hasPathOrQuery bool
			for _, p := range append(append(openapi3.Parameters{}, item.Parameters...), op.Parameters...) {
				params[p.Ref] = true
				if p.Value.In == openapi3.ParameterInPath || p.Value.In == openapi3.ParameterInQuery {
					hasPathOrQuery = true
				}
				if p.Value.In == openapi3.ParameterInPath && uuidPathParams[p.Value.Name] {
					if p.Value.Schema == nil || p.Value.Schema.Value.Format != "uuid" {
						t.Errorf("%s: path parameter %s must be format uuid", at, p.Value.Name)
					}
				}
			}
			if !params[xRequestIDParamRef] {
				t.Errorf("%s: does not reference the XRequestId parameter", at)
			}
			if strings.Contains(path, "{project_id}") && params[xProjectIDParamRef] {
				t.Errorf("%s: carries both the {project_id} path and X-Project-ID", at)
			}

			codes := map[string]bool{}
			for code, r := range op.Responses.Map() {
				codes[code] = true
				if h := r.Value.Headers["X-Request-Id"]; h == nil || h.Ref != xRequestIDHeadRef {
					t.Errorf("%s: response %s does not declare the X-Request-Id header", at, code)
				}
				if !strings.HasPrefix(code, "4") && !strings.HasPrefix(code, "5") {
					continue
				}
				if nonEnvelopeErrors[op.OperationID+" "+code] {
					continue
				}
				if !errorResponses[r.Ref] {
					t.Errorf("%s: error response %s must reference a components/responses entry whose body is ErrorResponse (got %q)", at, code, r.Ref)
				}
			}
			need := func(why string, want ...string) {
				for _, c := range want {
					if !codes[c] {
						t.Errorf("%s: %s, so it must declare %s", at, why, c)
					}
				}
			}
			need("every operation can fail", "500")

			public := op.Security != nil && len(*op.Security) == 0
			if public != publicOperations[op.OperationID] {
				t.Errorf("%s: public (security: []) = %v, want %v", at, public, publicOperations[op.OperationID])
			}
			internal := op.Security != nil && len(*op.Security) == 1 && (*op.Security)[0]["internalTokenAuth"] != nil
			// Opaque internal tokens: the JWKS refresh, Alertmanager's webhook into the
			// control plane (its token is Alertmanager's credentials_file) and Prometheus
			// scraping node agents through the control plane (its bearer's credentials_file).
			if internal != internalTokenOperations[op.OperationID] {
				t.Errorf("%s: internalTokenAuth is only for %v", at, internalTokenOperations)
			}
			if !public {
				need("it needs authentication", "401", "429")
			}
			if op.RequestBody != nil {
				if !op.RequestBody.Value.Required {
					t.Errorf("%s: request body must be required", at)
				}
				need("it takes a body", "400", "422")
			}
			if hasPathOrQuery {
				need("it takes path or query parameters", "422")
			}
			if params[idempotencyKeyRef] {
				need("it accepts Idempotency-Key", "409", "422")
			}
		}
	}
	if len(seen) == 0 {
		t.Fatal("no operations")
	}
}

// The OpenAPI 3.0 spelling of a nullable reference (`allOf: [$ref], nullable: true`) must
// accept null, closed objects must refuse unknown fields, and ids are UUIDv7.
func TestSchemaSemantics(t *testing.T) {
	doc := load(t)
	settings := func(name string) *openapi3.Schema { return doc.Components.Schemas[name].Value }
	ok := map[string]any{
		"tenant_id":            "01936b2e-7c4a-7d2e-9f1a-3b5c7d9e1f20",
		"default_currency":     "EUR",
		"supported_currencies": []any{"EUR", "USD"},
		"fx_snapshot":          nil,
	}
	if err := settings("BillingCurrencySettingsResponse").VisitJSON(ok); err != nil {
		t.Errorf("null fx_snapshot and a UUIDv7 must validate: %v", err)
	}
	withSnapshot := clone(ok)
	withSnapshot["fx_snapshot"] = map[string]any{
		"source_currency": "EUR", "target_currency": "USD", "rate": "1.0825", "provider": "ecb",
		"provider_rate_id": nil, "captured_at": "2026-11-21T05:00:00Z",
	}
	if err := settings("BillingCurrencySettingsResponse").VisitJSON(withSnapshot); err != nil {
		t.Errorf("a snapshot must validate: %v", err)
	}
	bad := []struct {
		why string
		mut func(map[string]any)
	}{
		{"unknown field", func(m map[string]any) { m["extra"] = true }},
		{"not a uuid", func(m map[string]any) { m["tenant_id"] = "tenant-1" }},
		{"lowercase currency", func(m map[string]any) { m["default_currency"] = "eur" }},
		{"no supported currency", func(m map[string]any) { m["supported_currencies"] = []any{} }},
		{"missing required nullable field", func(m map[string]any) { delete(m, "fx_snapshot") }},
		{"open snapshot", func(m map[string]any) { m["fx_snapshot"] = map[string]any{"rate": 1.08} }},
	}
	for _, tc := range bad {
		m := clone(ok)
		tc.mut(m)
		if err := settings("BillingCurrencySettingsResponse").VisitJSON(m); err == nil {
			t.Errorf("%s: want a validation error", tc.why)
		}
	}

	errBody := map[string]any{"code": "project_not_found", "message": "m", "correlation_id": "c"}
	if err := settings("ErrorResponse").VisitJSON(errBody); err == nil {
		t.Error("ErrorResponse must refuse a code outside the seed's enum")
	}
	errBody["code"] = "user_not_found"
	errBody["details"] = map[string]any{"service": "controlplane", "trace_id": "abc"}
	if err := settings("ErrorResponse").VisitJSON(errBody); err != nil {
		t.Errorf("ErrorResponse with free-form details: %v", err)
	}
}

func TestErrorCodesAreTheSeeds(t *testing.T) {
	doc := load(t)
	want := []string{
		"token_missing", "token_invalid", "token_expired", "token_scope_invalid",
		"auth_personal_disabled", "auth_enterprise_required", "auth_personal_required",
		"insufficient_permissions", "admin_required", "ownership_required", "step_up_required",
		"validation_error", "invalid_request",
		"allocation_not_found", "allocation_not_active", "allocation_already_releasing", "allocation_concurrency_limit",
		"insufficient_balance", "sku_unavailable", "sku_not_found", "refund_window_exceeded", "payment_signature_invalid",
		"node_not_found", "node_offline", "node_in_use", "node_already_exists",
		"user_not_found", "user_already_exists",
		"storage_object_not_found", "storage_path_traversal", "storage_already_exists", "storage_quota_exceeded",
		"app_not_found", "app_version_not_found", "app_not_entitled", "app_instance_not_found",
		"app_instance_state_invalid", "app_instance_quota_exceeded",
		"rate_limit_exceeded", "internal_error", "upstream_error", "service_unavailable",
	}
	var got []string
	for _, v := range doc.Components.Schemas["ErrorCode"].Value.Enum {
		got = append(got, v.(string))
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("ErrorCode enum = %v\nwant %v", got, want)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func clone(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
