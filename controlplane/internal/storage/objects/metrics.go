package objects

// Metrics is what the object store counts (the storage service's /metrics counters).
type Metrics interface {
	BytesIn(n int64)
	BytesOut(n int64)
	ObjectPut()
	ObjectDeleted()
	QuotaRefused()
	TraversalRefused()
}

type noMetrics struct{}

func (noMetrics) BytesIn(int64)     {}
func (noMetrics) BytesOut(int64)    {}
func (noMetrics) ObjectPut()        {}
func (noMetrics) ObjectDeleted()    {}
func (noMetrics) QuotaRefused()     {}
func (noMetrics) TraversalRefused() {}
