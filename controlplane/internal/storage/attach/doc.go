// Package attach attaches buckets into allocations (docs/storage.md, "Attachments").
//
// It owns:
//   - storage_attachments and the attachment state machine (state.go): attaching →
//     attached | failed, attached → detaching → detached, and every live attachment
//     detached when its allocation ends;
//   - the API POST/GET /api/v1/allocations/{allocation_id}/storage-attachments and
//     DELETE .../{attachment_id} (handlers.go), audited, with outbox events;
//   - delivery of the storage.attach / storage.detach tasks to the allocation's node
//     over the fabric (delivery.go), and the agent's results of them;
//   - the control-plane side of fabricv1.StorageFabric (fabric.go): the node's agent
//     reads and writes the attached bucket through it, so nodes hold no storage
//     credentials.
//
// It never decides who may use a bucket (storage.Service.Authorize does, once, at
// attach time) and never touches bytes or quota itself: reads and writes go through
// the objects package's ObjectAccess, so a write from an allocation counts against the
// bucket project's quota and is visible through the API like any other.
package attach
