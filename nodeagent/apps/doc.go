// Package apps is the node agent's app supervisor: it runs app instances (a catalog
// app version's process: Jupyter, an inference server, a small HTTP app) inside an
// allocation's runtime on this node, keeps them running, and tells the control plane
// what it sees.
//
// # Tasks
//
// app.start (fabricv1.AppStartTask, proto/fabric/apptask) starts the version's command
// in the allocation's environment: as the allocation's user (runtime.SessionEnv: its
// UID/GID under the linux-user runtime, inside the allocation's systemd slice with its
// device policy where there is one), with the allocation's environment
// (CUDA_VISIBLE_DEVICES naming only its GPUs, GANTRY_ALLOCATION_ID so stopping the
// allocation ends the app too) plus the version's, in its own process group. Every
// argument and env value is templated: {port}, {gpu_ids}, {gpu_uuids}, {gpu_count},
// {home}, {instance_dir}, {base_path}, {app_instance_id}, {allocation_id}. The task
// succeeds once the process is started; it fails with allocation_not_active,
// insufficient_gpus, start_failed or app_instance_terminal. A repeated start of a
// supervised instance answers the same port again.
//
// app.stop (fabricv1.AppStopTask) sends SIGTERM to the instance's process group,
// SIGKILL after the grace period, and stops supervising it ("stopped"). Stopping an
// instance the node does not know succeeds and reports it stopped.
//
// # States
//
//	starting   started, health check not passed yet (also while a never-healthy
//	           process is restarted)
//	running    the health check passes (HTTP 2xx/3xx on the path, or a TCP connect)
//	unhealthy  was running; now failure_threshold checks in a row failed, or the
//	           process exited and is restarted after a backoff
//	stopped    app.stop, or its allocation stopped/was released on this node
//	failed     never healthy within startup_timeout (never_healthy), more than
//	           max_restarts exits in a row without becoming healthy (crash_loop), or
//	           the command could not be started (start_failed)
//
// An exit is restarted after backoff_min·2^(n-1) (at most backoff_max), n counting the
// exits since the process was last healthy. The generation of an instance increases
// only when its state or reason changes, so a report that repeats one the control plane
// has is recognisably a heartbeat (seed §6.2: audited only on change).
//
// # Reports and restarts of the agent
//
// Each instance's record (spec, port, pid, state, generation) is a JSON file under
// <state dir>/apps, written before a change is reported. The agent sends every
// instance's latest report on each new tunnel, when it changes, and every
// ReportInterval. When the agent stops, app processes keep running; the next agent
// adopts a process that is still alive (same pid, still tagged with
// GANTRY_APP_INSTANCE_ID) without restarting it or changing its state, and restarts
// one that died meanwhile like any exit. Records of stopped and failed instances are
// reported for TerminalTTL, then forgotten.
//
// # App proxy streams
//
// STREAM_KIND_APP_PROXY streams (ServeStream) are connected to 127.0.0.1:<port> of the
// named instance while it is starting, running or unhealthy and its allocation is live.
package apps
