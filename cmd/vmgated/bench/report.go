package bench

import (
	"math"
	"slices"
	"time"
)

// The report's figures and how samples are summarised.

// Stat summarises samples in milliseconds.
type Stat struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	Min float64 `json:"min"`
	Max float64 `json:"max"`
}

func summarize(d []time.Duration) Stat {
	if len(d) == 0 {
		return Stat{}
	}
	ms := make([]float64, len(d))
	for i, x := range d {
		ms[i] = float64(x.Microseconds()) / 1000
	}
	slices.Sort(ms)
	return Stat{N: len(ms), P50: percentile(ms, 50), P95: percentile(ms, 95), Min: ms[0], Max: ms[len(ms)-1]}
}

// percentile of sorted values, nearest rank.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Throughput is one concurrency level of one-shot commands.
type Throughput struct {
	Concurrency int     `json:"concurrency"`
	Commands    int     `json:"commands"`
	Seconds     float64 `json:"seconds"`
	PerMinute   float64 `json:"per_minute"`
	FromPool    int     `json:"from_pool"`
}

// Memory is the host memory of one idle VM's QEMU, from smaps_rollup.
type Memory struct {
	VMs    int     `json:"vms"`
	RSSMiB float64 `json:"rss_mib"`
	PSSMiB float64 `json:"pss_mib"`
}

// Machine describes the host the figures come from.
type Machine struct {
	CPUModel    string `json:"cpu_model"`
	CPUs        int    `json:"cpus"`
	MemTotalMiB int64  `json:"mem_total_mib"`
	Kernel      string `json:"kernel"`
	QEMU        string `json:"qemu"`
	Accel       string `json:"accel"`
	Cgroups     string `json:"cgroups"`
}

// ExecReport holds every figure of one run.
type ExecReport struct {
	Machine         Machine         `json:"machine"`
	When            time.Time       `json:"when"`
	ColdBootMS      Stat            `json:"cold_boot_ms"`
	TemplateMS      float64         `json:"template_ms"`
	TemplateBuilt   bool            `json:"template_built"`
	TemplateRAMMiB  float64         `json:"template_ram_data_mib"`
	RestoreMS       Stat            `json:"restore_ms"`
	RestorePhasesMS map[string]Stat `json:"restore_phases_ms"`
	RestoreFirstMS  Stat            `json:"restore_first_exec_ms"`
	// The same restore completed from a clone launched ahead
	// (vm.Template.Prestart): timed from Complete, QEMU already up.
	RestoreAheadMS       Stat            `json:"restore_ahead_ms"`
	RestoreAheadPhasesMS map[string]Stat `json:"restore_ahead_phases_ms"`
	RestoreAheadFirstMS  Stat            `json:"restore_ahead_first_exec_ms"`
	// IdleAhead is a clone launched ahead, waiting: its QEMU's memory.
	IdleAhead       Memory          `json:"idle_ahead_qemu"`
	ColdPhasesMS    map[string]Stat `json:"cold_phases_ms"`
	OneshotPoolMS   Stat            `json:"oneshot_pool_ms"`
	OneshotNoPoolMS Stat            `json:"oneshot_nopool_ms"`
	// The same through a profile with a network (an allowlist; the
	// command makes no connection): VMs with a NIC, from their own
	// template and pool, handed out once their network is ready.
	OneshotNetPoolMS   Stat `json:"oneshot_net_pool_ms"`
	OneshotNetNoPoolMS Stat `json:"oneshot_net_nopool_ms"`
	// RestoreHandshakeFailures counts restores in this run whose first
	// agent handshake failed (each replaced by a second clone); 0 is the
	// only right value.
	RestoreHandshakeFailures int64 `json:"restore_handshake_failures"`
	// The daemon's own account of each one-shot: getting the VM (boot_ms),
	// running the command (exec_ms) and its whole handling (total_ms).
	OneshotPoolPartsMS      map[string]Stat `json:"oneshot_pool_parts_ms"`
	OneshotNoPoolPartsMS    map[string]Stat `json:"oneshot_nopool_parts_ms"`
	OneshotNetPoolPartsMS   map[string]Stat `json:"oneshot_net_pool_parts_ms"`
	OneshotNetNoPoolPartsMS map[string]Stat `json:"oneshot_net_nopool_parts_ms"`
	SessionExecMS           Stat            `json:"session_exec_ms"`
	// Receipts, each figure a baseline without and the same with a
	// receipt (signed by the daemon, checked by the client), in pairs of
	// alternating order so that drift falls on both alike. Refused
	// requests (a policy denial: decision, audit record, answer; no VM)
	// isolate what a receipt adds: ReceiptOverheadMS is the median of
	// those pairs' differences (its budget: ReceiptBudgetMS). `true` in a
	// daemon's session shows it beside a command's whole round trip,
	// whose noise under TCG can exceed it (ReceiptOverheadSessionMS).
	RefusalNoReceiptMS       Stat         `json:"refusal_no_receipt_ms"`
	RefusalReceiptMS         Stat         `json:"refusal_receipt_ms"`
	ReceiptOverheadMS        float64      `json:"receipt_overhead_ms"`
	SessionNoReceiptMS       Stat         `json:"session_exec_no_receipt_ms"`
	SessionReceiptMS         Stat         `json:"session_exec_receipt_ms"`
	ReceiptOverheadSessionMS float64      `json:"receipt_overhead_session_ms"`
	Throughput               []Throughput `json:"throughput"`
	IdleRestored             Memory       `json:"idle_restored_vm"`
	// IdleRestoredN is the mean per VM with 1, 4 and 8 restored VMs idle.
	IdleRestoredN []Memory `json:"idle_restored_vms"`
	// Levers says which speed and memory levers this run used.
	Levers   map[string]any `json:"levers"`
	IdleCold Memory         `json:"idle_cold_vm"`
	// Sessions that last and branch (sessions.go): a session of the
	// default shape that wrote SessionFileMiB of files and runs a
	// background process.
	PauseMS       Stat    `json:"pause_ms"`
	ResumeMS      Stat    `json:"resume_ms"`
	ForkMS        Stat    `json:"fork_ms"`
	Fork4MS       Stat    `json:"fork4_ms"`
	ForkIdle      Memory  `json:"fork_idle"`
	ForkIdlePSS   float64 `json:"fork_idle_pss_mib"`
	PausedDiskMiB float64 `json:"paused_disk_mib"`
	// A session as a machine (machine.go): a command beside three that
	// run, a background process's start, and the logs of a finished one
	// that wrote 64 KiB.
	SessionConcurrentMS Stat `json:"session_concurrent_ms"`
	DetachMS            Stat `json:"detach_ms"`
	LogsMS              Stat `json:"logs_ms"`
	// The E2B door (e2b.go), each beside the same work through the
	// local API.
	E2BCreateMS    Stat `json:"e2b_create_ms"`
	APISessionMS   Stat `json:"api_session_ms"`
	E2BRunMS       Stat `json:"e2b_run_ms"`
	APIRunMS       Stat `json:"api_run_ms"`
	E2BWrite1MiBMS Stat `json:"e2b_write_1mib_ms"`
	APIWrite1MiBMS Stat `json:"api_write_1mib_ms"`
	// An HTTPS request from the guest with a secret, through the
	// netstack's interception, beside one without (secrets.go).
	SecretHTTPSMS Stat `json:"secret_https_ms"`
	HTTPSMS       Stat `json:"https_ms"`
	// SecretOverheadMS is the median of the pairs' differences (with
	// minus without), the interception's cost; its budget is
	// SecretBudgetMS.
	SecretOverheadMS float64            `json:"secret_https_overhead_ms"`
	Ratios           map[string]float64 `json:"ratios"`
	Notes            []string           `json:"notes,omitempty"`
}
