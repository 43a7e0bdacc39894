package agent

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"

	"github.com/gantry-gpu/gantry/nodeagent/gpu"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
	"github.com/gantry-gpu/gantry/shared/fabricnet"
)

// The agent's metrics never leave the node through a listening port (a GPU host listens
// for nothing): the control plane opens a STREAM_KIND_METRICS stream through the tunnel,
// the agent answers with the text exposition, and the control plane serves it to
// Prometheus (docs/nodeagent.md, "Metrics").
const (
	// MaxMetricsBytes bounds one exposition; the control plane reads no more.
	MaxMetricsBytes = 4 << 20
	// metricsWriteTimeout bounds writing the exposition to the stream.
	metricsWriteTimeout = 10 * time.Second
)

// Task outcomes of gantry_nodeagent_tasks_total.
const (
	outcomeSucceeded = "succeeded"
	outcomeFailed    = "failed"
	outcomeRejected  = "rejected"
)

// metrics is the agent's registry. Most values are read from the agent's state when
// Prometheus asks (collector), so nothing can drift from what Status reports.
type metrics struct {
	reg   *prometheus.Registry
	tasks *prometheus.CounterVec
}

func newMetrics(a *Agent) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		tasks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gantry_nodeagent_tasks_total",
			Help: "Tasks the control plane dispatched, by kind and outcome (succeeded, failed, rejected); redeliveries are not counted.",
		}, []string{"kind", "outcome"}),
	}
	m.reg.MustRegister(m.tasks, agentCollector{a},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

var (
	descBuild         = prometheus.NewDesc("gantry_nodeagent_build_info", "The agent's version and commit (always 1).", []string{"version", "commit"}, nil)
	descConnected     = prometheus.NewDesc("gantry_nodeagent_tunnel_connected", "1 while the fabric tunnel is established, by transport (quic, tcp; none when down).", []string{"transport"}, nil)
	descSessions      = prometheus.NewDesc("gantry_nodeagent_tunnel_sessions_total", "Fabric tunnels established since the agent started.", nil, nil)
	descReconnects    = prometheus.NewDesc("gantry_nodeagent_tunnel_reconnects_total", "Reconnect attempts (a tunnel that ended or failed to establish) since the agent started.", nil, nil)
	descHeartbeats    = prometheus.NewDesc("gantry_nodeagent_heartbeats_sent_total", "Heartbeats sent to the control plane.", nil, nil)
	descTelemetry     = prometheus.NewDesc("gantry_nodeagent_telemetry_sent_total", "GPU telemetry samples sent to the control plane.", nil, nil)
	descPending       = prometheus.NewDesc("gantry_nodeagent_task_results_pending", "Finished task results waiting for the control plane's acknowledgement.", nil, nil)
	descRunning       = prometheus.NewDesc("gantry_nodeagent_tasks_running", "Tasks running now.", nil, nil)
	descGPUs          = prometheus.NewDesc("gantry_nodeagent_gpus", "GPUs in the node's last inventory.", nil, nil)
	gpuLabels         = []string{"gpu_index", "gpu_uuid", "model"}
	descGPUUtil       = prometheus.NewDesc("gantry_nodeagent_gpu_utilization_percent", "GPU utilisation in the last sample.", gpuLabels, nil)
	descGPUMemUsed    = prometheus.NewDesc("gantry_nodeagent_gpu_memory_used_bytes", "GPU memory in use in the last sample.", gpuLabels, nil)
	descGPUMemTotal   = prometheus.NewDesc("gantry_nodeagent_gpu_memory_total_bytes", "GPU memory from the inventory.", gpuLabels, nil)
	descGPUTemp       = prometheus.NewDesc("gantry_nodeagent_gpu_temperature_celsius", "GPU temperature in the last sample.", gpuLabels, nil)
	descGPUPower      = prometheus.NewDesc("gantry_nodeagent_gpu_power_watts", "GPU power draw in the last sample.", gpuLabels, nil)
	descGPUHealthy    = prometheus.NewDesc("gantry_nodeagent_gpu_healthy", "1 when the last sample found the GPU healthy.", gpuLabels, nil)
	descGPUECC        = prometheus.NewDesc("gantry_nodeagent_gpu_ecc_uncorrected_errors", "Uncorrected ECC errors the driver reports for the GPU.", gpuLabels, nil)
	descLogEvents     = prometheus.NewDesc("gantry_nodeagent_log_events_sent_total", "Log events delivered to the log gateway.", nil, nil)
	descLogBatches    = prometheus.NewDesc("gantry_nodeagent_log_batches_sent_total", "Log batches (pushes) the log gateway accepted.", nil, nil)
	descLogDropped    = prometheus.NewDesc("gantry_nodeagent_log_events_dropped_total", "Log events dropped, by reason (queue_full, too_old, spool_full, rejected).", []string{"reason"}, nil)
	descLogRetries    = prometheus.NewDesc("gantry_nodeagent_log_push_retries_total", "Failed log pushes that were retried.", nil, nil)
	descScrapeSamples = prometheus.NewDesc("gantry_nodeagent_gpu_sample_age_seconds", "Age of the last GPU sample (telemetry interval plus delay).", nil, nil)
	descObjects       = prometheus.NewDesc("gantry_nodeagent_controller_objects", "Objects the node's controllers manage (app instances, ...), by controller and state.", []string{"controller", "state"}, nil)
	descReportsSent   = prometheus.NewDesc("gantry_nodeagent_controller_reports_sent_total", "Controller reports sent to the control plane (changes and repeats).", nil, nil)
)

type agentCollector struct{ a *Agent }

func (c agentCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c agentCollector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	a.mu.Lock()
	st := a.st
	reconnects := a.reconnects
	inv := a.lastInv
	samples := append([]gpu.Metrics(nil), a.lastSamples...)
	sampledAt := a.lastSampleAt
	pending := len(a.unreported)
	a.mu.Unlock()

	ch <- prometheus.MustNewConstMetric(descBuild, prometheus.GaugeValue, 1, orUnknown(a.o.AgentVersion), orUnknown(a.o.AgentCommit))
	transport, up := st.Transport, 0.0
	if st.Connected {
		up = 1
	}
	if transport == "" {
		transport = "none"
	}
	ch <- prometheus.MustNewConstMetric(descConnected, prometheus.GaugeValue, up, transport)
	ch <- prometheus.MustNewConstMetric(descSessions, prometheus.CounterValue, float64(st.Sessions))
	ch <- prometheus.MustNewConstMetric(descReconnects, prometheus.CounterValue, float64(reconnects))
	ch <- prometheus.MustNewConstMetric(descHeartbeats, prometheus.CounterValue, float64(st.HeartbeatsSent))
	ch <- prometheus.MustNewConstMetric(descTelemetry, prometheus.CounterValue, float64(st.TelemetrySent))
	ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(pending))
	ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, float64(len(a.once.Active())))
	ch <- prometheus.MustNewConstMetric(descGPUs, prometheus.GaugeValue, float64(len(inv.GPUs)))

	byUUID := map[string]gpu.GPU{}
	for _, g := range inv.GPUs {
		byUUID[g.UUID] = g
		ch <- prometheus.MustNewConstMetric(descGPUMemTotal, prometheus.GaugeValue, float64(g.MemoryBytes), strconv.Itoa(g.Index), g.UUID, g.Model)
	}
	for _, s := range samples {
		g, ok := byUUID[s.UUID]
		if !ok {
			continue // a GPU gone from the inventory since the sample
		}
		lv := []string{strconv.Itoa(g.Index), g.UUID, g.Model}
		healthy := 0.0
		if s.Healthy {
			healthy = 1
		}
		ch <- prometheus.MustNewConstMetric(descGPUUtil, prometheus.GaugeValue, float64(s.UtilizationPercent), lv...)
		ch <- prometheus.MustNewConstMetric(descGPUMemUsed, prometheus.GaugeValue, float64(s.MemoryUsedBytes), lv...)
		ch <- prometheus.MustNewConstMetric(descGPUTemp, prometheus.GaugeValue, float64(s.TemperatureC), lv...)
		ch <- prometheus.MustNewConstMetric(descGPUPower, prometheus.GaugeValue, float64(s.PowerMilliwatts)/1000, lv...)
		ch <- prometheus.MustNewConstMetric(descGPUHealthy, prometheus.GaugeValue, healthy, lv...)
		ch <- prometheus.MustNewConstMetric(descGPUECC, prometheus.GaugeValue, float64(s.ECCUncorrected), lv...)
	}
	if !sampledAt.IsZero() {
		ch <- prometheus.MustNewConstMetric(descScrapeSamples, prometheus.GaugeValue, a.o.Clock.Now().Sub(sampledAt).Seconds())
	}
	if a.o.Reports != nil {
		ch <- prometheus.MustNewConstMetric(descReportsSent, prometheus.CounterValue, float64(st.ReportsSent))
		type key struct{ controller, state string }
		counts := map[key]int{}
		for _, r := range a.o.Reports.Reports() {
			counts[key{r.GetController(), r.GetState()}]++
		}
		for k, n := range counts {
			ch <- prometheus.MustNewConstMetric(descObjects, prometheus.GaugeValue, float64(n), k.controller, k.state)
		}
	}
	if a.o.LogStats != nil {
		ls := a.o.LogStats()
		ch <- prometheus.MustNewConstMetric(descLogEvents, prometheus.CounterValue, float64(ls.Sent))
		ch <- prometheus.MustNewConstMetric(descLogBatches, prometheus.CounterValue, float64(ls.SentBatches))
		ch <- prometheus.MustNewConstMetric(descLogRetries, prometheus.CounterValue, float64(ls.Retries))
		for reason, n := range map[string]int64{"queue_full": ls.DroppedQueueFull, "too_old": ls.DroppedTooOld, "spool_full": ls.DroppedSpoolFull, "rejected": ls.DroppedRejected} {
			ch <- prometheus.MustNewConstMetric(descLogDropped, prometheus.CounterValue, float64(n), reason)
		}
	}
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// taskOutcome counts one task by kind and outcome. Kinds the agent has no executor for
// are counted as "unsupported", so a bad dispatch cannot grow the label set.
func (a *Agent) taskOutcome(kind, outcome string) {
	a.metrics.tasks.WithLabelValues(kind, outcome).Inc()
}

// Gatherer is the agent's registry (tests, and an embedding process that wants to serve
// it itself).
func (a *Agent) Gatherer() prometheus.Gatherer { return a.metrics.reg }

// Exposition renders the registry in the Prometheus text format.
func (a *Agent) Exposition() ([]byte, error) {
	mfs, err := a.metrics.reg.Gather()
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}

// serveMetrics answers a METRICS stream: an ok reply, the exposition, then the close
// that tells the control plane it has everything.
func (a *Agent) serveMetrics(_ context.Context, st net.Conn) {
	defer func() { _ = st.Close() }()
	_ = st.SetWriteDeadline(time.Now().Add(metricsWriteTimeout))
	body, err := a.Exposition()
	if err == nil && len(body) > MaxMetricsBytes {
		err = errTooLarge
	}
	if err != nil {
		a.log.Warn("metrics exposition failed", "err", err)
		_ = writeReply(st, false, "metrics_unavailable", err.Error())
		return
	}
	if err := writeReply(st, true, "", ""); err != nil {
		return
	}
	_, _ = st.Write(body)
}

var errTooLarge = errors.New("metrics exposition exceeds the size limit")

func writeReply(st net.Conn, ok bool, code, msg string) error {
	return fabricnet.WriteReply(st, &fabricv1.StreamReply{Ok: ok, ErrorCode: code, Message: msg})
}
