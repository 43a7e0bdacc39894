// Package catalog owns what a tenant can launch: regions (V3Region), SKUs (a GPU model
// and count with vCPU, memory and disk, the billing usage unit that prices it, and the
// regions that offer it) and OS images; their admin CRUD; and the catalog read model
// that shows each active SKU with its price per currency and its live availability per
// region.
//
// It reads prices through Prices (implemented over billing's pricing plans by
// BillingPrices) and free GPUs through Fleet (implemented over node administration's
// fleet view by NodesFleet); it never reads billing's or nodes' tables. It never
// reserves capacity: availability is a snapshot, and placement (allocations) decides.
//
// Error codes where the contract has no dedicated one (seed §7.2, ARCHITECTURE §3):
//   - an unknown SKU is 404 sku_not_found (the public catalog also answers it for an
//     inactive SKU);
//   - an unknown region or OS image is 404 invalid_request, details.reason not_found;
//   - a taken SKU id, region code or OS image name is 409 invalid_request with
//     details.reason sku_exists, region_exists or os_image_exists;
//   - a SKU that names a region that does not exist is 422 validation_error, field
//     regions, reason unknown_region; a SKU id whose ".Nx" suffix differs from gpu_count
//     is 422 validation_error, field id, reason gpu_count_mismatch;
//   - deleting a SKU that live allocations use is 409 invalid_request, reason
//     sku_in_use.
//
// Every admin mutation writes its audit row and outbox event in the same transaction;
// a request that changes nothing writes neither.
package catalog
