#!/usr/bin/awk -f
# Reads `go test -bench BenchmarkTerminal` output and prints each path's echo p50/p99 and
# the p99 it adds over the direct PTY baseline (goal: <= 1 ms idle, <= 2 ms while a bulk
# transfer shares the same tunnel), and output throughput ratios.
#
# Baselines: pty-direct (idle) for the idle paths; for a path under bulk, the direct PTY
# echo measured under the same bulk (pty-direct-under-bulk, pty-direct-under-paced-bulk),
# so that "added" is what the path adds and not the CPU the bulk takes from every party
# on a small machine; the figure over the idle baseline is printed beside it.
/^Benchmark/ {
	name = $1; sub(/-[0-9]+$/, "", name); sub(/^BenchmarkTerminal/, "", name)
	p50 = ""; p99 = ""; mbs = ""; bulk = ""
	for (i = 2; i <= NF; i++) {
		if ($i == "p50-µs") p50 = $(i-1)
		if ($i == "p99-µs") p99 = $(i-1)
		if ($i == "MB/s") mbs = $(i-1)
		if ($i == "bulk-MB/s") bulk = $(i-1)
	}
	if (p99 != "") {
		kind = name; sub(/^.*\//, "", kind)
		if (kind ~ /^pty-direct/) base[kind] = p99
		n++; names[n] = name; kinds[n] = kind; p50s[n] = p50; p99s[n] = p99; bulks[n] = bulk
	}
	if (mbs != "") {
		if (name ~ /pty-direct/) basemb = mbs
		m++; tn[m] = name; tm[m] = mbs
	}
}
END {
	for (i = 1; i <= n; i++) {
		k = kinds[i]
		load = ""
		if (k ~ /under-paced-bulk$/) load = "pty-direct-under-paced-bulk"
		else if (k ~ /under-bulk$/) load = "pty-direct-under-bulk"
		goal = (load != "") ? 2000 : 1000
		ref = (load != "") ? base[load] : base["pty-direct"]
		added = p99s[i] - ref
		line = sprintf("  %-40s echo p50 %7.0f µs  p99 %7.0f µs", names[i], p50s[i], p99s[i])
		if (bulks[i] != "") line = line sprintf("  (bulk %.0f MB/s)", bulks[i])
		if (k ~ /^pty-direct/) {
			print line "  baseline"
			continue
		}
		line = line sprintf("  added p99 %7.0f µs", added)
		if (load != "") line = line sprintf(" (%.0f µs over idle pty-direct)", p99s[i] - base["pty-direct"])
		printf "%s  goal <= %d µs: %s\n", line, goal, (added <= goal ? "meets" : "misses")
	}
	for (i = 1; i <= m; i++) {
		printf "  %-40s output %7.1f MB/s  = %.2fx pty-direct\n", tn[i], tm[i], (basemb > 0 ? tm[i] / basemb : 0)
	}
}
