package apps

import (
	"context"
	"net/http"

	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// The stubs answer every operation of issue 23 that is not built yet with a 501
// envelope, so that the contract and the tree build while the feature packages land.
// app.New swaps each one for its package's Handlers once that package exists.

func notImplemented() error {
	return apierr.New(apierr.ServiceUnavailable, "this operation is not implemented yet").WithStatus(http.StatusNotImplemented)
}

// InstancesStub stands in for the operations of its package.
type InstancesStub struct{}

// ListAppInstances is not implemented yet.
func (InstancesStub) ListAppInstances(context.Context, api.ListAppInstancesRequestObject) (api.ListAppInstancesResponseObject, error) {
	return nil, notImplemented()
}

// CreateAppInstance is not implemented yet.
func (InstancesStub) CreateAppInstance(context.Context, api.CreateAppInstanceRequestObject) (api.CreateAppInstanceResponseObject, error) {
	return nil, notImplemented()
}

// GetAppInstance is not implemented yet.
func (InstancesStub) GetAppInstance(context.Context, api.GetAppInstanceRequestObject) (api.GetAppInstanceResponseObject, error) {
	return nil, notImplemented()
}

// DeleteAppInstance is not implemented yet.
func (InstancesStub) DeleteAppInstance(context.Context, api.DeleteAppInstanceRequestObject) (api.DeleteAppInstanceResponseObject, error) {
	return nil, notImplemented()
}

// SharedRuntimesStub stands in for the operations of its package.
type SharedRuntimesStub struct{}

// CreateSharedRuntime is not implemented yet.
func (SharedRuntimesStub) CreateSharedRuntime(context.Context, api.CreateSharedRuntimeRequestObject) (api.CreateSharedRuntimeResponseObject, error) {
	return nil, notImplemented()
}

// ListSharedRuntimes is not implemented yet.
func (SharedRuntimesStub) ListSharedRuntimes(context.Context, api.ListSharedRuntimesRequestObject) (api.ListSharedRuntimesResponseObject, error) {
	return nil, notImplemented()
}

// GetSharedRuntime is not implemented yet.
func (SharedRuntimesStub) GetSharedRuntime(context.Context, api.GetSharedRuntimeRequestObject) (api.GetSharedRuntimeResponseObject, error) {
	return nil, notImplemented()
}

// ListSharedRuntimeAttachments is not implemented yet.
func (SharedRuntimesStub) ListSharedRuntimeAttachments(context.Context, api.ListSharedRuntimeAttachmentsRequestObject) (api.ListSharedRuntimeAttachmentsResponseObject, error) {
	return nil, notImplemented()
}

// CreateSharedRuntimeAttachment is not implemented yet.
func (SharedRuntimesStub) CreateSharedRuntimeAttachment(context.Context, api.CreateSharedRuntimeAttachmentRequestObject) (api.CreateSharedRuntimeAttachmentResponseObject, error) {
	return nil, notImplemented()
}

// DeleteSharedRuntimeAttachment is not implemented yet.
func (SharedRuntimesStub) DeleteSharedRuntimeAttachment(context.Context, api.DeleteSharedRuntimeAttachmentRequestObject) (api.DeleteSharedRuntimeAttachmentResponseObject, error) {
	return nil, notImplemented()
}

// ListSharedRuntimeRepairOperations is not implemented yet.
func (SharedRuntimesStub) ListSharedRuntimeRepairOperations(context.Context, api.ListSharedRuntimeRepairOperationsRequestObject) (api.ListSharedRuntimeRepairOperationsResponseObject, error) {
	return nil, notImplemented()
}

// CreateSharedRuntimeRepairOperation is not implemented yet.
func (SharedRuntimesStub) CreateSharedRuntimeRepairOperation(context.Context, api.CreateSharedRuntimeRepairOperationRequestObject) (api.CreateSharedRuntimeRepairOperationResponseObject, error) {
	return nil, notImplemented()
}

// GetSharedRuntimeRepairOperation is not implemented yet.
func (SharedRuntimesStub) GetSharedRuntimeRepairOperation(context.Context, api.GetSharedRuntimeRepairOperationRequestObject) (api.GetSharedRuntimeRepairOperationResponseObject, error) {
	return nil, notImplemented()
}

// ListSharedRuntimeWorkers is not implemented yet.
func (SharedRuntimesStub) ListSharedRuntimeWorkers(context.Context, api.ListSharedRuntimeWorkersRequestObject) (api.ListSharedRuntimeWorkersResponseObject, error) {
	return nil, notImplemented()
}

// ListSharedRuntimeWorkerOperations is not implemented yet.
func (SharedRuntimesStub) ListSharedRuntimeWorkerOperations(context.Context, api.ListSharedRuntimeWorkerOperationsRequestObject) (api.ListSharedRuntimeWorkerOperationsResponseObject, error) {
	return nil, notImplemented()
}

// CreateSharedRuntimeWorkerOperation is not implemented yet.
func (SharedRuntimesStub) CreateSharedRuntimeWorkerOperation(context.Context, api.CreateSharedRuntimeWorkerOperationRequestObject) (api.CreateSharedRuntimeWorkerOperationResponseObject, error) {
	return nil, notImplemented()
}

// GetSharedRuntimeWorkerOperation is not implemented yet.
func (SharedRuntimesStub) GetSharedRuntimeWorkerOperation(context.Context, api.GetSharedRuntimeWorkerOperationRequestObject) (api.GetSharedRuntimeWorkerOperationResponseObject, error) {
	return nil, notImplemented()
}
