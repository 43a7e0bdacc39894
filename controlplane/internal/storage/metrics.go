package storage

import "github.com/prometheus/client_golang/prometheus"

// Metrics are object storage's /metrics counters. storage/objects counts through them
// (it implements objects.Metrics); Register adds them to the registry.
type Metrics struct {
	bytesIn, bytesOut, objectsPut, objectsDeleted, quotaRefusals, traversalRefusals prometheus.Counter
	swept                                                                           *prometheus.CounterVec
}

func newMetrics() *Metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	return &Metrics{
		bytesIn:           c("storage_bytes_in_total", "Object bytes received by uploads that were stored."),
		bytesOut:          c("storage_bytes_out_total", "Object bytes sent to readers."),
		objectsPut:        c("storage_objects_put_total", "Objects stored (created or replaced)."),
		objectsDeleted:    c("storage_objects_deleted_total", "Objects deleted (by a request or a forced bucket delete)."),
		quotaRefusals:     c("storage_quota_refusals_total", "Uploads refused with storage_quota_exceeded."),
		traversalRefusals: c("storage_path_traversal_refusals_total", "Requests refused with storage_path_traversal."),
		swept: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "storage_sweeper_items_total",
			Help: "Work done by the storage sweeper, by kind (expired_upload, blob, bucket_object, bucket)."}, []string{"kind"}),
	}
}

// Register adds the counters to reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.bytesIn, m.bytesOut, m.objectsPut, m.objectsDeleted, m.quotaRefusals, m.traversalRefusals, m.swept} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// BytesIn counts n stored bytes.
func (m *Metrics) BytesIn(n int64) { m.bytesIn.Add(float64(n)) }

// BytesOut counts n bytes sent.
func (m *Metrics) BytesOut(n int64) { m.bytesOut.Add(float64(n)) }

// ObjectPut counts a stored object.
func (m *Metrics) ObjectPut() { m.objectsPut.Inc() }

// ObjectDeleted counts a deleted object.
func (m *Metrics) ObjectDeleted() { m.objectsDeleted.Inc() }

// QuotaRefused counts a storage_quota_exceeded refusal.
func (m *Metrics) QuotaRefused() { m.quotaRefusals.Inc() }

// TraversalRefused counts a storage_path_traversal refusal.
func (m *Metrics) TraversalRefused() { m.traversalRefusals.Inc() }
