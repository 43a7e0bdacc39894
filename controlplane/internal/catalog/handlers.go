package catalog

import (
	"context"

	"github.com/gantry-gpu/gantry/controlplane/internal/pagination"
	"github.com/gantry-gpu/gantry/controlplane/internal/principal"
	"github.com/gantry-gpu/gantry/proto/api"
)

// Handlers implements the catalog's slice of api.StrictServerInterface: AdminSkus,
// AdminOSImages, admin regions, Catalog and the v3 regions read model.
type Handlers struct {
	Svc     *Service
	Cursors pagination.Codec
}

// NewHandlers returns the handlers over svc.
func NewHandlers(svc *Service, cursors pagination.Codec) *Handlers {
	return &Handlers{Svc: svc, Cursors: cursors}
}

// Cursor sort keys (a cursor only works with the list that issued it).
const (
	sortSKUs       = "catalog_skus.id"
	sortActiveSKUs = "catalog_skus.active.id"
	sortImages     = "catalog_os_images.name"
	sortActiveImgs = "catalog_os_images.active.name"
)

func (h *Handlers) after(cursor *string, sort string) (string, error) {
	var after string
	err := h.Cursors.DecodeAfter(cursor, sort, &after)
	return after, err
}

func (h *Handlers) pagination(size int, more bool, sort, last string) (api.Pagination, error) {
	next, err := h.Cursors.Next(more, sort, last)
	return api.Pagination{PageSize: size, NextCursor: next}, err
}

// SKUs ----------------------------------------------------------------------------

func apiSKU(k SKU) api.SKU {
	regions := k.Regions
	if regions == nil {
		regions = []string{}
	}
	return api.SKU{
		ID: k.ID, DisplayName: k.DisplayName, GpuModel: k.GpuModel, GpuCount: int(k.GpuCount), Vcpu: int(k.Vcpu),
		MemoryGib: int(k.MemoryGib), DiskGib: int(k.DiskGib), UsageUnit: k.UsageUnit, Regions: regions,
		Active: k.Active, CreatedAt: k.CreatedAt, UpdatedAt: k.UpdatedAt,
	}
}

// ListAdminSkus implements GET /api/v1/admin/skus.
func (h *Handlers) ListAdminSkus(ctx context.Context, req api.ListAdminSkusRequestObject) (api.ListAdminSkusResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	after, err := h.after(req.Params.Cursor, sortSKUs)
	if err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	pg, err := h.Svc.ListSKUs(ctx, false, after, size)
	if err != nil {
		return nil, err
	}
	out := api.SKUListResponse{Items: make([]api.SKU, 0, len(pg.Items))}
	for _, k := range pg.Items {
		out.Items = append(out.Items, apiSKU(k))
	}
	last := ""
	if len(pg.Items) > 0 {
		last = pg.Items[len(pg.Items)-1].ID
	}
	if out.Pagination, err = h.pagination(size, pg.More, sortSKUs, last); err != nil {
		return nil, err
	}
	return api.ListAdminSkus200JSONResponse{Body: out}, nil
}

// CreateSku implements POST /api/v1/admin/skus.
func (h *Handlers) CreateSku(ctx context.Context, req api.CreateSkuRequestObject) (api.CreateSkuResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	b := req.Body
	k, err := h.Svc.CreateSKU(ctx, SKUSpec{
		ID: b.ID, DisplayName: b.DisplayName, GPUModel: b.GpuModel, GPUCount: b.GpuCount, VCPU: b.Vcpu,
		MemoryGiB: b.MemoryGib, DiskGiB: b.DiskGib, UsageUnit: b.UsageUnit, Regions: b.Regions, Active: b.Active,
	})
	if err != nil {
		return nil, err
	}
	return api.CreateSku201JSONResponse{Body: apiSKU(k)}, nil
}

// GetAdminSku implements GET /api/v1/admin/skus/{sku}.
func (h *Handlers) GetAdminSku(ctx context.Context, req api.GetAdminSkuRequestObject) (api.GetAdminSkuResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	k, err := h.Svc.GetSKU(ctx, req.Sku)
	if err != nil {
		return nil, err
	}
	return api.GetAdminSku200JSONResponse{Body: apiSKU(k)}, nil
}

// UpdateSku implements PATCH /api/v1/admin/skus/{sku}.
func (h *Handlers) UpdateSku(ctx context.Context, req api.UpdateSkuRequestObject) (api.UpdateSkuResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	b := req.Body
	p := SKUPatch{DisplayName: b.DisplayName, VCPU: b.Vcpu, MemoryGiB: b.MemoryGib, DiskGiB: b.DiskGib, UsageUnit: b.UsageUnit, Active: b.Active}
	if b.Regions != nil {
		p.Regions = &b.Regions
	}
	k, err := h.Svc.UpdateSKU(ctx, req.Sku, p)
	if err != nil {
		return nil, err
	}
	return api.UpdateSku200JSONResponse{Body: apiSKU(k)}, nil
}

// DeleteSku implements DELETE /api/v1/admin/skus/{sku}.
func (h *Handlers) DeleteSku(ctx context.Context, req api.DeleteSkuRequestObject) (api.DeleteSkuResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	if err := h.Svc.DeleteSKU(ctx, req.Sku); err != nil {
		return nil, err
	}
	return api.DeleteSku204Response{}, nil
}

// Catalog -------------------------------------------------------------------------

func apiOffer(o Offer) api.CatalogSKU {
	k := o.SKU
	out := api.CatalogSKU{
		ID: k.ID, DisplayName: k.DisplayName, GpuModel: k.GpuModel, GpuCount: int(k.GpuCount), Vcpu: int(k.Vcpu),
		MemoryGib: int(k.MemoryGib), DiskGib: int(k.DiskGib), UsageUnit: k.UsageUnit,
		Prices:       make([]api.CatalogSKUPrice, 0, len(o.Prices)),
		Availability: make([]api.CatalogSKUAvailability, 0, len(o.Availability)),
	}
	for _, p := range o.Prices {
		out.Prices = append(out.Prices, api.CatalogSKUPrice{
			Currency: p.Currency, UnitPrice: p.UnitPrice, HourlyRate: api.Money{AmountMinor: p.HourlyMinor, Currency: p.Currency},
			PricingPlanID: p.PlanID, PricingPlanVersion: int(p.PlanVersion),
		})
	}
	for _, a := range o.Availability {
		out.Availability = append(out.Availability, api.CatalogSKUAvailability{
			RegionCode: a.Region, RegionState: api.V3RegionAvailabilityState(a.State), FreeGpus: a.FreeGPUs,
			AvailableCount: a.Count, Available: a.Available(),
		})
	}
	return out
}

// ListCatalogSkus implements GET /api/v1/catalog/skus.
func (h *Handlers) ListCatalogSkus(ctx context.Context, req api.ListCatalogSkusRequestObject) (api.ListCatalogSkusResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	after, err := h.after(req.Params.Cursor, sortActiveSKUs)
	if err != nil {
		return nil, err
	}
	size := pagination.Size(req.Params.PageSize)
	pg, err := h.Svc.Offers(ctx, p.TenantID, after, size)
	if err != nil {
		return nil, err
	}
	out := api.CatalogSKUListResponse{Items: make([]api.CatalogSKU, 0, len(pg.Items))}
	for _, o := range pg.Items {
		out.Items = append(out.Items, apiOffer(o))
	}
	last := ""
	if len(pg.Items) > 0 {
		last = pg.Items[len(pg.Items)-1].SKU.ID
	}
	if out.Pagination, err = h.pagination(size, pg.More, sortActiveSKUs, last); err != nil {
		return nil, err
	}
	return api.ListCatalogSkus200JSONResponse{Body: out}, nil
}

// GetCatalogSku implements GET /api/v1/catalog/skus/{sku}.
func (h *Handlers) GetCatalogSku(ctx context.Context, req api.GetCatalogSkuRequestObject) (api.GetCatalogSkuResponseObject, error) {
	p, err := principal.Required(ctx)
	if err != nil {
		return nil, err
	}
	o, err := h.Svc.Offer(ctx, p.TenantID, req.Sku)
	if err != nil {
		return nil, err
	}
	return api.GetCatalogSku200JSONResponse{Body: apiOffer(o)}, nil
}

// OS images -----------------------------------------------------------------------

func apiImage(im OSImage) api.OSImage {
	return api.OSImage{
		ID: im.ID, Name: im.Name, DisplayName: im.DisplayName, Distribution: im.Distribution, Version: im.Version,
		ImageRef: im.ImageRef, IsDefault: im.IsDefault, Active: im.Active, CreatedAt: im.CreatedAt, UpdatedAt: im.UpdatedAt,
	}
}

func (h *Handlers) listImages(ctx context.Context, activeOnly bool, cursor *string, pageSize *int) (api.OSImageListResponse, error) {
	sort := sortImages
	if activeOnly {
		sort = sortActiveImgs
	}
	after, err := h.after(cursor, sort)
	if err != nil {
		return api.OSImageListResponse{}, err
	}
	size := pagination.Size(pageSize)
	pg, err := h.Svc.ListOSImages(ctx, activeOnly, after, size)
	if err != nil {
		return api.OSImageListResponse{}, err
	}
	out := api.OSImageListResponse{Items: make([]api.OSImage, 0, len(pg.Items))}
	for _, im := range pg.Items {
		out.Items = append(out.Items, apiImage(im))
	}
	last := ""
	if len(pg.Items) > 0 {
		last = pg.Items[len(pg.Items)-1].Name
	}
	out.Pagination, err = h.pagination(size, pg.More, sort, last)
	return out, err
}

// ListAdminOsImages implements GET /api/v1/admin/os-images.
func (h *Handlers) ListAdminOsImages(ctx context.Context, req api.ListAdminOsImagesRequestObject) (api.ListAdminOsImagesResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	out, err := h.listImages(ctx, false, req.Params.Cursor, req.Params.PageSize)
	if err != nil {
		return nil, err
	}
	return api.ListAdminOsImages200JSONResponse{Body: out}, nil
}

// ListCatalogOsImages implements GET /api/v1/catalog/os-images.
func (h *Handlers) ListCatalogOsImages(ctx context.Context, req api.ListCatalogOsImagesRequestObject) (api.ListCatalogOsImagesResponseObject, error) {
	if _, err := principal.Required(ctx); err != nil {
		return nil, err
	}
	out, err := h.listImages(ctx, true, req.Params.Cursor, req.Params.PageSize)
	if err != nil {
		return nil, err
	}
	return api.ListCatalogOsImages200JSONResponse{Body: out}, nil
}

// CreateOsImage implements POST /api/v1/admin/os-images.
func (h *Handlers) CreateOsImage(ctx context.Context, req api.CreateOsImageRequestObject) (api.CreateOsImageResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	b := req.Body
	isDefault := b.IsDefault != nil && *b.IsDefault
	im, err := h.Svc.CreateOSImage(ctx, OSImageSpec{
		Name: b.Name, DisplayName: b.DisplayName, Distribution: b.Distribution, Version: b.Version,
		ImageRef: b.ImageRef, IsDefault: isDefault, Active: b.Active,
	})
	if err != nil {
		return nil, err
	}
	return api.CreateOsImage201JSONResponse{Body: apiImage(im)}, nil
}

// GetAdminOsImage implements GET /api/v1/admin/os-images/{image_id}.
func (h *Handlers) GetAdminOsImage(ctx context.Context, req api.GetAdminOsImageRequestObject) (api.GetAdminOsImageResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	im, err := h.Svc.GetOSImage(ctx, req.ImageID)
	if err != nil {
		return nil, err
	}
	return api.GetAdminOsImage200JSONResponse{Body: apiImage(im)}, nil
}

// UpdateOsImage implements PATCH /api/v1/admin/os-images/{image_id}.
func (h *Handlers) UpdateOsImage(ctx context.Context, req api.UpdateOsImageRequestObject) (api.UpdateOsImageResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	b := req.Body
	im, err := h.Svc.UpdateOSImage(ctx, req.ImageID, OSImagePatch{
		DisplayName: b.DisplayName, Version: b.Version, ImageRef: b.ImageRef, IsDefault: b.IsDefault, Active: b.Active,
	})
	if err != nil {
		return nil, err
	}
	return api.UpdateOsImage200JSONResponse{Body: apiImage(im)}, nil
}

// DeleteOsImage implements DELETE /api/v1/admin/os-images/{image_id}.
func (h *Handlers) DeleteOsImage(ctx context.Context, req api.DeleteOsImageRequestObject) (api.DeleteOsImageResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	if err := h.Svc.DeleteOSImage(ctx, req.ImageID); err != nil {
		return nil, err
	}
	return api.DeleteOsImage204Response{}, nil
}

// Regions -------------------------------------------------------------------------

func apiRegion(r Region) api.V3Region {
	return api.V3Region{
		Code: r.Code, APIRegionCode: r.ApiRegionCode, Label: r.Label, IsDefault: r.IsDefault,
		IsAvailable:       r.AvailabilityState == RegionAvailable,
		AvailabilityState: api.V3RegionAvailabilityState(r.AvailabilityState), CapacityScopeHint: r.CapacityScopeHint,
	}
}

func strPtr(s *api.V3RegionAvailabilityState) *string {
	if s == nil {
		return nil
	}
	v := string(*s)
	return &v
}

// CreateRegion implements POST /api/v1/admin/regions.
func (h *Handlers) CreateRegion(ctx context.Context, req api.CreateRegionRequestObject) (api.CreateRegionResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	b := req.Body
	r, err := h.Svc.CreateRegion(ctx, RegionSpec{
		Code: b.Code, APIRegionCode: b.APIRegionCode, Label: b.Label, IsDefault: b.IsDefault != nil && *b.IsDefault,
		AvailabilityState: strPtr(b.AvailabilityState), CapacityScopeHint: b.CapacityScopeHint,
	})
	if err != nil {
		return nil, err
	}
	return api.CreateRegion201JSONResponse{Body: apiRegion(r)}, nil
}

// UpdateRegion implements PATCH /api/v1/admin/regions/{region_code}.
func (h *Handlers) UpdateRegion(ctx context.Context, req api.UpdateRegionRequestObject) (api.UpdateRegionResponseObject, error) {
	if _, err := principal.PlatformAdmin(ctx); err != nil {
		return nil, err
	}
	b := req.Body
	r, err := h.Svc.UpdateRegion(ctx, req.RegionCode, RegionPatch{
		APIRegionCode: b.APIRegionCode, Label: b.Label, IsDefault: b.IsDefault,
		AvailabilityState: strPtr(b.AvailabilityState), CapacityScopeHint: b.CapacityScopeHint,
	})
	if err != nil {
		return nil, err
	}
	return api.UpdateRegion200JSONResponse{Body: apiRegion(r)}, nil
}

// ListV3Regions implements GET /api/v1/v3/regions.
func (h *Handlers) ListV3Regions(ctx context.Context, _ api.ListV3RegionsRequestObject) (api.ListV3RegionsResponseObject, error) {
	if _, err := principal.Required(ctx); err != nil {
		return nil, err
	}
	regions, err := h.Svc.Regions(ctx)
	if err != nil {
		return nil, err
	}
	out := api.V3RegionListResponse{
		Items: make([]api.V3Region, 0, len(regions)),
		Meta:  api.V3ReadModelMeta{GeneratedAt: h.Svc.now(), Cache: api.V3ReadModelMetaCache("bypass")},
	}
	for _, r := range regions {
		out.Items = append(out.Items, apiRegion(r))
		if r.IsDefault {
			code := r.Code
			out.CurrentRegionCode = &code
		}
	}
	return api.ListV3Regions200JSONResponse{Body: out}, nil
}
