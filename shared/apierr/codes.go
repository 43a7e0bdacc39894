package apierr

import (
	"net/http"
	"strings"
)

// Code is a stable error code of the contract. Codes never change meaning across versions.
type Code string

// Authentication.
const (
	TokenMissing           Code = "token_missing"
	TokenInvalid           Code = "token_invalid"
	TokenExpired           Code = "token_expired"
	TokenScopeInvalid      Code = "token_scope_invalid"
	AuthPersonalDisabled   Code = "auth_personal_disabled"
	AuthEnterpriseRequired Code = "auth_enterprise_required"
	AuthPersonalRequired   Code = "auth_personal_required"
)

// Authorization.
const (
	InsufficientPermissions Code = "insufficient_permissions"
	AdminRequired           Code = "admin_required"
	OwnershipRequired       Code = "ownership_required"
	StepUpRequired          Code = "step_up_required"
)

// Validation.
const (
	ValidationError Code = "validation_error"
	InvalidRequest  Code = "invalid_request"
)

// Allocation.
const (
	AllocationNotFound         Code = "allocation_not_found"
	AllocationNotActive        Code = "allocation_not_active"
	AllocationAlreadyReleasing Code = "allocation_already_releasing"
	AllocationConcurrencyLimit Code = "allocation_concurrency_limit"
)

// Billing and capacity.
const (
	InsufficientBalance     Code = "insufficient_balance"
	SKUUnavailable          Code = "sku_unavailable"
	SKUNotFound             Code = "sku_not_found"
	RefundWindowExceeded    Code = "refund_window_exceeded"
	PaymentSignatureInvalid Code = "payment_signature_invalid"
)

// Node.
const (
	NodeNotFound      Code = "node_not_found"
	NodeOffline       Code = "node_offline"
	NodeInUse         Code = "node_in_use"
	NodeAlreadyExists Code = "node_already_exists"
)

// User.
const (
	UserNotFound      Code = "user_not_found"
	UserAlreadyExists Code = "user_already_exists"
)

// Storage.
const (
	StorageObjectNotFound Code = "storage_object_not_found"
	StoragePathTraversal  Code = "storage_path_traversal"
	StorageAlreadyExists  Code = "storage_already_exists"
	StorageQuotaExceeded  Code = "storage_quota_exceeded"
)

// Apps.
const (
	AppNotFound              Code = "app_not_found"
	AppVersionNotFound       Code = "app_version_not_found"
	AppNotEntitled           Code = "app_not_entitled"
	AppInstanceNotFound      Code = "app_instance_not_found"
	AppInstanceStateInvalid  Code = "app_instance_state_invalid"
	AppInstanceQuotaExceeded Code = "app_instance_quota_exceeded"
)

// Platform.
const (
	RateLimitExceeded  Code = "rate_limit_exceeded"
	InternalError      Code = "internal_error"
	UpstreamError      Code = "upstream_error"
	ServiceUnavailable Code = "service_unavailable"
)

// All lists every code of the contract, in the order of seed §7.2.
var All = []Code{
	TokenMissing, TokenInvalid, TokenExpired, TokenScopeInvalid, AuthPersonalDisabled, AuthEnterpriseRequired, AuthPersonalRequired,
	InsufficientPermissions, AdminRequired, OwnershipRequired, StepUpRequired,
	ValidationError, InvalidRequest,
	AllocationNotFound, AllocationNotActive, AllocationAlreadyReleasing, AllocationConcurrencyLimit,
	InsufficientBalance, SKUUnavailable, SKUNotFound, RefundWindowExceeded, PaymentSignatureInvalid,
	NodeNotFound, NodeOffline, NodeInUse, NodeAlreadyExists,
	UserNotFound, UserAlreadyExists,
	StorageObjectNotFound, StoragePathTraversal, StorageAlreadyExists, StorageQuotaExceeded,
	AppNotFound, AppVersionNotFound, AppNotEntitled, AppInstanceNotFound, AppInstanceStateInvalid, AppInstanceQuotaExceeded,
	RateLimitExceeded, InternalError, UpstreamError, ServiceUnavailable,
}

// statusOf is our table (ARCHITECTURE §3); the contract leaves it open.
var statusOf = map[Code]int{
	TokenMissing: 401, TokenInvalid: 401, TokenExpired: 401, TokenScopeInvalid: 401,
	AuthPersonalDisabled: 403, AuthEnterpriseRequired: 403, AuthPersonalRequired: 403,
	InsufficientPermissions: 403, AdminRequired: 403, OwnershipRequired: 403, StepUpRequired: 403, AppNotEntitled: 403,
	// ARCHITECTURE §3 puts the quotas with the limits at 429 (no Retry-After: waiting
	// alone does not free a storage quota); an object over the per-PUT limit is 413 where
	// it is refused (docs/storage.md).
	StorageQuotaExceeded: 429,
	InvalidRequest:       400, PaymentSignatureInvalid: 400, StoragePathTraversal: 400,
	ValidationError:     422,
	AllocationNotActive: 409, AllocationAlreadyReleasing: 409, NodeOffline: 409, NodeInUse: 409,
	AppInstanceStateInvalid: 409, RefundWindowExceeded: 409, SKUUnavailable: 409,
	InsufficientBalance: 402,
	RateLimitExceeded:   429, AllocationConcurrencyLimit: 429, AppInstanceQuotaExceeded: 429,
	InternalError: 500, UpstreamError: 502, ServiceUnavailable: 503,
}

// HTTPStatus is the status a code is answered with. *_not_found is 404 and
// *_already_exists is 409 by rule; an unknown code is a server bug, so 500.
func (c Code) HTTPStatus() int {
	if s, ok := statusOf[c]; ok {
		return s
	}
	switch {
	case strings.HasSuffix(string(c), "_not_found"):
		return http.StatusNotFound
	case strings.HasSuffix(string(c), "_already_exists"):
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}
