package maastest

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

func (s *Server) route(method string, parts []string, op string, form, query url.Values) (any, error) {
	switch {
	case len(parts) == 1 && parts[0] == "users" && method == http.MethodGet && op == "whoami":
		return map[string]any{"username": s.cfg.User, "email": s.cfg.User + "@maas.example", "is_superuser": true, "is_local": true,
			"resource_uri": apiPrefix + "users/" + s.cfg.User + "/"}, nil
	case len(parts) == 1 && parts[0] == "machines":
		switch {
		case method == http.MethodGet && op == "":
			return s.list(query, false), nil
		case method == http.MethodGet && op == "list_allocated":
			return s.list(query, true), nil
		case method == http.MethodPost && op == "allocate":
			return s.allocate(form)
		}
	case len(parts) == 2 && parts[0] == "machines":
		id := parts[1]
		switch {
		case method == http.MethodGet && op == "":
			return s.get(id)
		case method == http.MethodGet && op == "query_power_state":
			return s.queryPower(id)
		case method == http.MethodPost:
			return s.action(id, op, form)
		}
	case len(parts) == 3 && parts[0] == "nodes" && parts[2] == "devices" && method == http.MethodGet && op == "":
		return s.devices(parts[1], query)
	default:
		return nil, errf(http.StatusNotFound, "Not Found")
	}
	return nil, errf(http.StatusBadRequest, "Unrecognised signature: method=%s op=%s", method, op)
}

func (s *Server) list(q url.Values, allocatedOnly bool) []machineJSON {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []machineJSON{}
	for _, id := range sortedIDs(s.machines) {
		m := s.machines[id]
		if allocatedOnly && m.owner == "" {
			continue
		}
		if !in(q["id"], m.spec.SystemID) || !in(q["hostname"], m.spec.Hostname, m.spec.Hostname+".maas") ||
			!in(q["agent_name"], m.agentName) || !in(q["pool"], m.spec.Pool) || !in(q["zone"], m.spec.Zone) ||
			!hasAll(m.spec.Tags, q["tags"]) {
			continue
		}
		out = append(out, m.json())
	}
	return out
}

// in: an empty filter matches everything; otherwise one of haves must be listed.
func in(filter []string, haves ...string) bool {
	if len(filter) == 0 {
		return true
	}
	for _, f := range filter {
		for _, h := range haves {
			if f == h {
				return true
			}
		}
	}
	return false
}

// splitList flattens repeated and comma-separated values (MAAS accepts both for tags).
func splitList(vals []string) []string {
	var out []string
	for _, v := range vals {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

func hasAll(have, want []string) bool {
	for _, w := range splitList(want) {
		found := false
		for _, h := range have {
			if h == w {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func hasNone(have, not []string) bool {
	for _, n := range splitList(not) {
		for _, h := range have {
			if h == n {
				return false
			}
		}
	}
	return true
}

func boolParam(form url.Values, key string) bool {
	switch strings.ToLower(form.Get(key)) {
	case "true", "1", "on", "yes":
		return true
	}
	return false
}

func (s *Server) get(id string) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.machines[id]
	if m == nil {
		return nil, errf(http.StatusNotFound, "No Machine matches the given query.")
	}
	return m.json(), nil
}

func (s *Server) devices(id string, q url.Values) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.machines[id]
	if m == nil {
		return nil, errf(http.StatusNotFound, "No Node matches the given query.")
	}
	out := []device{}
	for _, d := range m.devices() {
		if matchesDevice(d, q) {
			out = append(out, d)
		}
	}
	return out, nil
}

func (s *Server) queryPower(id string) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.machines[id]
	if m == nil {
		return nil, errf(http.StatusNotFound, "No Machine matches the given query.")
	}
	if m.status == StatusMissing || m.take(PowerFailure) {
		return nil, errf(http.StatusServiceUnavailable, "Failed to query node's BMC - (%s) - Connection timed out", m.spec.Hostname)
	}
	return map[string]string{"state": m.power}, nil
}

// allocate reserves the first Ready machine (by system id) that matches every
// constraint; under the server's lock, so two callers never get the same one.
func (s *Server) allocate(form url.Values) (any, error) {
	minCPU, _ := strconv.Atoi(form.Get("cpu_count"))
	minMem, _ := strconv.ParseFloat(form.Get("mem"), 64)
	arch := form.Get("arch")
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range sortedIDs(s.machines) {
		m := s.machines[id]
		if !allowed("allocate", m.status) {
			continue
		}
		if v := form.Get("system_id"); v != "" && v != m.spec.SystemID {
			continue
		}
		if v := form.Get("name"); v != "" && v != m.spec.Hostname && v != m.spec.Hostname+".maas" {
			continue
		}
		if v := form.Get("pool"); v != "" && v != m.spec.Pool {
			continue
		}
		if v := form.Get("zone"); v != "" && v != m.spec.Zone {
			continue
		}
		if arch != "" && arch != m.spec.Arch && !strings.HasPrefix(m.spec.Arch, arch+"/") {
			continue
		}
		if minCPU > m.spec.CPUCount || minMem > float64(m.spec.MemoryMiB) || !hasAll(m.spec.Tags, form["tags"]) || !hasNone(m.spec.Tags, form["not_tags"]) {
			continue
		}
		if boolParam(form, "dry_run") {
			return m.json(), nil
		}
		m.gen++
		m.set(StatusAllocated, "")
		m.owner, m.agentName, m.comment = s.cfg.User, form.Get("agent_name"), form.Get("comment")
		m.allocations++
		return m.json(), nil
	}
	return nil, errf(http.StatusConflict, "No available machine matches constraints: %s", describe(form))
}

// describe echoes the constraints the way MAAS's 409 does (never the user data: an
// allocate carries none).
func describe(form url.Values) string {
	var parts []string
	for _, k := range []string{"system_id", "name", "pool", "zone", "arch", "cpu_count", "mem", "tags", "not_tags"} {
		if vals := form[k]; len(vals) > 0 {
			parts = append(parts, k+"="+strings.Join(vals, ","))
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func (s *Server) action(id, op string, form url.Values) (any, error) {
	s.mu.Lock()
	m := s.machines[id]
	if m == nil {
		s.mu.Unlock()
		return nil, errf(http.StatusNotFound, "No Machine matches the given query.")
	}
	if _, known := actionableFrom[op]; !known || op == "allocate" {
		s.mu.Unlock()
		return nil, errf(http.StatusBadRequest, "Unrecognised signature: method=POST op=%s", op)
	}
	if op == "set_storage_layout" && !allowed(op, m.status) {
		s.mu.Unlock() // MAAS's NodeStateViolation, word for word
		return nil, errf(http.StatusConflict, "Cannot change the storage layout on a machine that is not Ready.")
	}
	if !allowed(op, m.status) {
		st := m.status
		s.mu.Unlock()
		return nil, errf(http.StatusConflict, "%s cannot be %s: it's in state '%s'.", id, pastTense(op), st)
	}
	var stop Instance
	var err error
	switch op {
	case "commission":
		s.commission(m)
	case "deploy":
		err = s.deploy(m, form)
	case "release":
		stop = s.release(m, form)
	case "abort":
		stop = s.abort(m)
	case "set_storage_layout":
		layout := form.Get("storage_layout")
		if !StorageLayouts[layout] {
			err = errf(http.StatusBadRequest, `{"storage_layout": ["Select a valid choice. %s is not one of the available choices."]}`, layout)
			break
		}
		m.storageLayout = layout
		m.layoutSets++
	case "mark_broken":
		m.gen++
		m.before = m.status
		m.set(StatusBroken, form.Get("comment"))
	case "mark_fixed":
		m.gen++
		if m.commissioned {
			m.set(StatusReady, "")
		} else {
			m.set(StatusNew, "")
		}
	case "power_on":
		if m.take(PowerFailure) {
			err = errf(http.StatusServiceUnavailable, "Failed to power on node - (%s) - Connection timed out", m.spec.Hostname)
			break
		}
		m.power = "on"
		m.powerOns++
		if m.status == StatusDeployed && m.boot != nil && !m.running {
			s.restart(m)
		}
	case "power_off":
		if m.take(PowerFailure) {
			err = errf(http.StatusServiceUnavailable, "Failed to power off node - (%s) - Connection timed out", m.spec.Hostname)
			break
		}
		m.power = "off"
		stop = m.halt()
	}
	var res machineJSON
	if err == nil {
		res = m.json()
	}
	s.mu.Unlock()
	if stop != nil {
		// The machine powers off in the background, as MAAS answers before the BMC acts.
		go func() { _ = stop.Stop() }()
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// DefaultStorageLayout is MAAS's default_storage_layout setting out of the box.
const DefaultStorageLayout = "flat"

// StorageLayouts are the layouts MAAS's set_storage_layout accepts.
var StorageLayouts = map[string]bool{"flat": true, "lvm": true, "bcache": true, "vmfs6": true, "vmfs7": true, "custom": true, "blank": true}

func pastTense(op string) string {
	switch op {
	case "commission":
		return "commissioned"
	case "deploy":
		return "deployed"
	case "release":
		return "released"
	case "abort":
		return "aborted"
	case "mark_broken":
		return "marked broken"
	case "mark_fixed":
		return "marked fixed"
	}
	return "acted on (" + op + ")"
}

// step runs fn (under the lock) after d, unless another action superseded this one. A
// Stalled step instead fails after the node timeout with failed/msg.
func (s *Server) step(m *machine, d time.Duration, failed Status, what string, fn func()) {
	m.gen++
	gen := m.gen
	if m.timer != nil {
		m.timer.Stop()
	}
	if m.take(Stall) {
		d = s.cfg.Durations.NodeTimeout
		fn = func() {
			m.set(failed, "Node operation '"+what+"' timed out after "+s.cfg.Durations.NodeTimeout.String()+".")
			m.power = "off"
		}
	}
	m.timer = time.AfterFunc(d, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed || m.gen != gen {
			return
		}
		fn()
	})
}

func (s *Server) commission(m *machine) {
	m.commissions++
	m.before = m.status
	if m.before != StatusNew {
		m.before = StatusReady
	}
	m.set(StatusCommissioning, "Commissioning")
	m.power = "on"
	d := s.cfg.Durations
	if m.take(PowerFailure) {
		s.step(m, 0, StatusFailedCommissioning, "Commissioning", func() {
			m.set(StatusFailedCommissioning, "Power on for the node failed: Failed to power on node - Connection timed out")
			m.power = "unknown"
		})
		return
	}
	s.step(m, d.Commissioning, StatusFailedCommissioning, "Commissioning", func() {
		if m.take(FailCommissioning) {
			m.set(StatusFailedCommissioning, "Failed commissioning: 50-maas-01-commissioning exited with status 1")
			m.power = "off"
			return
		}
		m.commissioned = true
		m.set(StatusTesting, "Testing")
		s.step(m, d.Testing, StatusFailedTesting, "Testing", func() {
			if m.take(FailTesting) {
				m.set(StatusFailedTesting, "Failed testing: smartctl-validate failed on nvme0n1")
				m.power = "off"
				return
			}
			m.set(StatusReady, "")
			m.power = "off"
		})
	})
}

func (s *Server) deploy(m *machine, form url.Values) error {
	raw := form.Get("user_data")
	var userData []byte
	if raw != "" {
		var err error
		if userData, err = base64.StdEncoding.DecodeString(raw); err != nil {
			return errf(http.StatusBadRequest, `{"user_data": ["Invalid base64 encoding."]}`)
		}
	}
	if m.status == StatusReady { // deploy allocates implicitly
		m.owner = s.cfg.User
		m.allocations++
	}
	if v := form.Get("agent_name"); v != "" {
		m.agentName = v
	}
	m.deploys++
	m.userData = userData
	m.osystem = form.Get("osystem")
	if m.osystem == "" {
		m.osystem = "ubuntu"
	}
	m.distroSeries = form.Get("distro_series")
	if m.distroSeries == "" {
		m.distroSeries = "jammy"
	}
	m.hweKernel = form.Get("hwe_kernel")
	m.bootErr, m.bootDir = "", ""
	m.set(StatusDeploying, "Deploying")
	m.power = "on"
	if m.take(PowerFailure) {
		s.step(m, 0, StatusFailedDeployment, "Deploying", func() {
			m.set(StatusFailedDeployment, "Power on for the node failed: Failed to power on node - Connection timed out")
			m.power = "unknown"
		})
		return nil
	}
	s.step(m, s.cfg.Durations.Deploying, StatusFailedDeployment, "Deploying", func() {
		if m.take(FailDeployment) {
			m.set(StatusFailedDeployment, "Installation failed (refer to the installation log for more information).")
			m.power = "off"
			return
		}
		m.set(StatusDeployed, "Deployed "+m.osystem+" "+m.distroSeries)
		s.startBoot(m)
	})
	return nil
}

func (s *Server) release(m *machine, form url.Values) Instance {
	stop := m.halt()
	m.boot = nil // the disks are wiped or reused: the next deploy boots afresh
	m.releases++
	erase := ""
	switch {
	case boolParam(form, "secure_erase"):
		erase = "secure"
	case boolParam(form, "quick_erase"):
		erase = "quick"
	case boolParam(form, "erase"):
		erase = "full"
	}
	if erase != "" && !boolParam(form, "erase") {
		// MAAS ignores quick/secure without erase=true.
		erase = ""
	}
	m.lastErase = erase
	finish := func() {
		m.set(StatusReady, "")
		m.power = "off"
		m.owner, m.agentName, m.comment, m.osystem, m.distroSeries, m.hweKernel, m.userData = "", "", "", "", "", "", nil
	}
	if m.take(PowerFailure) {
		m.set(StatusReleasing, "Releasing")
		s.step(m, 0, StatusFailedReleasing, "Releasing", func() {
			m.set(StatusFailedReleasing, "Power off for the node failed: Failed to power off node - Connection timed out")
			m.power = "unknown"
		})
		return stop
	}
	if erase == "" {
		m.set(StatusReleasing, "Releasing")
		s.step(m, s.cfg.Durations.Releasing, StatusFailedReleasing, "Releasing", func() {
			if m.take(FailReleasing) {
				m.set(StatusFailedReleasing, "Failed to release node: power off timed out")
				return
			}
			finish()
		})
		return stop
	}
	d := map[string]time.Duration{"quick": s.cfg.Durations.QuickErase, "secure": s.cfg.Durations.SecureErase, "full": s.cfg.Durations.FullErase}[erase]
	m.set(StatusDiskErasing, "Erasing disks ("+erase+")")
	m.power = "on"
	s.step(m, d, StatusFailedDiskErasing, "Disk erasing", func() {
		if m.take(FailErasing) {
			m.set(StatusFailedDiskErasing, "Failed to erase disks: wipe-disks exited with status 1")
			m.power = "off"
			return
		}
		finish()
	})
	return stop
}

func (s *Server) abort(m *machine) Instance {
	m.gen++
	if m.timer != nil {
		m.timer.Stop()
	}
	switch m.status {
	case StatusCommissioning, StatusTesting:
		m.set(m.before, "Aborted commissioning")
	case StatusDeploying:
		m.set(StatusAllocated, "Aborted deployment")
	case StatusDiskErasing:
		m.set(StatusFailedDiskErasing, "Aborted disk erasing")
	}
	m.power = "off"
	return m.halt()
}
