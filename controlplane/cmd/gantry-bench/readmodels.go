package main

// The v3 read-model benchmarks (issue 21), each against the raw SQL it needs, measured
// in the same run and interleaved:
//
//   - GET /api/v1/v3/workloads, first page (50), for a project with 10,000 workloads
//     (goal p99 <= 50 ms) vs the page's SELECT run directly on the pool;
//   - GET /api/v1/v3/shell/context answered from the cache (goal p99 <= 5 ms) vs the
//     attention-counter SELECT a cache miss runs.
//
// Latencies are of sequential requests from one client (p50/p99 of every request).

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

const readModelWorkloads = 10_000

func runReadModels(ctx context.Context, fx *fixture, rounds int) error {
	now := time.Now().UTC()
	// 10,000 allocations in the bench project: mostly released history, some live, a
	// few release failures (actionable and aged).
	if _, err := fx.pool.Exec(ctx, `
		INSERT INTO allocations (id, tenant_id, project_id, owner_user_id, name, sku, gpu_model, gpu_count, usage_unit, region_code,
		    node_id, ssh_key_ids, ssh_public_keys, status, hourly_rate_minor, currency, created_at, updated_at, active_at, ended_at)
		SELECT gen_random_uuid(), $1, $2, $3, 'wl-' || n, 'h100.1x', 'NVIDIA H100', 1, 'gpu.h100', 'eu-west-1', gen_random_uuid(), '{}', '{}',
		       CASE WHEN n % 100 = 0 THEN 'release_failed' WHEN n % 10 = 0 THEN 'active' ELSE 'released' END,
		       250, 'USD', $4::timestamptz - make_interval(mins => n + 5), $4::timestamptz - make_interval(mins => n),
		       $4::timestamptz - make_interval(mins => n + 4),
		       CASE WHEN n % 10 = 0 THEN NULL ELSE $4::timestamptz - make_interval(mins => n) END
		FROM generate_series(1, $5) AS n`, fx.tenantID, fx.projectID, fx.adminID, now, readModelWorkloads); err != nil {
		return err
	}
	if _, err := fx.pool.Exec(ctx, `ANALYZE allocations`); err != nil {
		return err
	}
	chain := fx.serve(fx.app.Handler)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	call := func(path string, check string) time.Duration {
		req, _ := http.NewRequest(http.MethodGet, chain+path, nil)
		req.Header.Set("Authorization", "Bearer "+fx.token)
		req.Header.Set("X-Project-ID", fx.projectID.String())
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		el := time.Since(start)
		if resp.StatusCode != http.StatusOK || (check != "" && !strings.Contains(string(body), check)) {
			panic(fmt.Sprintf("GET %s: %d %.300s", path, resp.StatusCode, body))
		}
		return el
	}
	const samples = 400
	sample := func(op func() time.Duration) []time.Duration {
		out := make([]time.Duration, 0, samples)
		for range samples {
			out = append(out, op())
		}
		return out
	}

	// The page's SELECT, as the read model runs it for the first page.
	pageSQL := `SELECT a.id, a.tenant_id, a.name, a.status, a.project_id, p.name, a.region_code, a.sku, a.gpu_count, a.usage_unit,
       a.node_id, n.name, a.owner_user_id, u.username, a.created_at, a.updated_at, a.active_at, a.ended_at,
       a.hourly_rate_minor, a.currency, d.dismissed_at
FROM (SELECT * FROM allocations a WHERE a.project_id = $2 ORDER BY a.created_at DESC, a.id DESC LIMIT 51) a
JOIN projects p ON p.id = a.project_id
JOIN users u ON u.id = a.owner_user_id
LEFT JOIN nodes n ON n.id = a.node_id
LEFT JOIN v3_attention_dismissals d ON d.user_id = $1 AND d.allocation_id = a.id
     AND d.condition = a.status AND d.condition_since = a.updated_at
ORDER BY a.created_at DESC, a.id DESC`
	rawPage := func() time.Duration {
		start := time.Now()
		rows, err := fx.pool.Query(ctx, pageSQL, fx.adminID, fx.projectID)
		if err != nil {
			panic(err)
		}
		n := 0
		for rows.Next() {
			n++
		}
		rows.Close()
		if rows.Err() != nil || n != 51 {
			panic(fmt.Sprintf("raw page: %d rows %v", n, rows.Err()))
		}
		return time.Since(start)
	}
	var raw, api []time.Duration
	for range rounds {
		raw = append(raw, sample(rawPage)...)
		api = append(api, sample(func() time.Duration { return call("/api/v1/v3/workloads", `"next_cursor":"`) })...)
	}
	fmt.Printf("read models: GET /api/v1/v3/workloads first page (50 of %d workloads), %d sequential requests\n", readModelWorkloads, len(api))
	fmt.Printf("  baseline (the page's raw SELECT on the pool): p50 %s p99 %s\n", pct(raw, 50), pct(raw, 99))
	fmt.Printf("  full chain (auth, project access, contract, read model, cost projection): p50 %s p99 %s (goal p99 <= 50ms: %s)\n",
		pct(api, 50), pct(api, 99), verdict(pct(api, 99) <= 50*time.Millisecond))

	// The shell context: the attention counters are what a miss computes.
	attentionSQL := `WITH marker AS (
    SELECT coalesce((SELECT read_through FROM notification_read_markers WHERE user_id = $2),
                    (SELECT created_at FROM users WHERE id = $2)) AS at)
SELECT
  (SELECT count(*) FROM allocations a WHERE a.project_id = $1 AND a.status IN ('requested', 'provisioning', 'active', 'idle', 'stopped', 'restarting', 'releasing')),
  (SELECT count(*) FROM allocations a LEFT JOIN v3_attention_dismissals d ON d.user_id = $2 AND d.allocation_id = a.id
       AND d.condition = a.status AND d.condition_since = a.updated_at
   WHERE a.project_id = $1 AND a.status = 'release_failed' AND a.updated_at > $3 AND d.dismissed_at IS NULL),
  (SELECT count(*) FROM allocation_tasks t JOIN allocations a ON a.id = t.allocation_id WHERE a.project_id = $1 AND t.finished_at IS NULL),
  (SELECT count(*) FROM allocation_events e JOIN allocations a ON a.id = e.allocation_id
   WHERE a.project_id = $1 AND e.created_at > (SELECT at FROM marker))`
	rawAttention := func() time.Duration {
		start := time.Now()
		var a, b, c, d int64
		if err := fx.pool.QueryRow(ctx, attentionSQL, fx.projectID, fx.adminID, now.Add(-72*time.Hour)).Scan(&a, &b, &c, &d); err != nil {
			panic(err)
		}
		if a == 0 {
			panic("attention: no active workloads")
		}
		return time.Since(start)
	}
	// Two shells: without X-Project-ID (the tenant's default project, resolved when the
	// entry was computed) a hit reads nothing from the database; with it, the chain's
	// project-access check (one indexed query) runs before the cache is consulted.
	type shellRun struct {
		name, project string
		hit           []time.Duration
		hits, total   int
	}
	runs := []*shellRun{{name: "no X-Project-ID"}, {name: "with X-Project-ID", project: fx.projectID.String()}}
	shell := func(r *shellRun) func() time.Duration {
		return func() time.Duration {
			r.total++
			req, _ := http.NewRequest(http.MethodGet, chain+"/api/v1/v3/shell/context", nil)
			req.Header.Set("Authorization", "Bearer "+fx.token)
			if r.project != "" {
				req.Header.Set("X-Project-ID", r.project)
			}
			start := time.Now()
			resp, err := client.Do(req)
			if err != nil {
				panic(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			el := time.Since(start)
			if resp.StatusCode != http.StatusOK {
				panic(fmt.Sprintf("shell: %d %s", resp.StatusCode, body))
			}
			if strings.Contains(string(body), `"cache":"hit"`) {
				r.hits++
				r.hit = append(r.hit, el)
			}
			return el
		}
	}
	var rawA []time.Duration
	for _, r := range runs {
		shell(r)() // fill the cache
	}
	for range rounds {
		rawA = append(rawA, sample(rawAttention)...)
		for _, r := range runs {
			sample(shell(r))
		}
	}
	fmt.Printf("read models: GET /api/v1/v3/shell/context answered from the cache (fresh for 10s; misses left out)\n")
	fmt.Printf("  baseline (the attention counters' raw SELECT a miss runs): p50 %s p99 %s\n", pct(rawA, 50), pct(rawA, 99))
	for _, r := range runs {
		fmt.Printf("  full chain, cache hit, %s (%d of %d were hits): p50 %s p99 %s (goal p99 <= 5ms: %s)\n",
			r.name, r.hits, r.total, pct(r.hit, 50), pct(r.hit, 99), verdict(pct(r.hit, 99) <= 5*time.Millisecond))
	}
	fmt.Println()
	return nil
}
