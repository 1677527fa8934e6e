package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/e2bfront"
	"github.com/vmgate/vmgate/gateway/receipt"
	"github.com/vmgate/vmgate/gateway/sshfront"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/netstack"
)

// DefaultConfig is the policy file vmgated serve reads when --config is not
// given; when it does not exist the embedded default policy applies.
const DefaultConfig = "/etc/vmgate/vmgate.toml"

// DefaultSSHAuthorizedKeys is the SSH front door's authorized-keys file
// when --ssh-authorized-keys is not given.
const DefaultSSHAuthorizedKeys = "/etc/vmgate/ssh_authorized_keys"

// DefaultE2BKeys is the E2B door's keys file when --e2b-keys is not given.
const DefaultE2BKeys = "/etc/vmgate/e2b_keys"

func serve(fs *pflag.FlagSet) runFunc {
	config := fs.String("config", "", "policy file (default "+DefaultConfig+" if it exists, else the embedded default policy)")
	socket := fs.String("socket", "", "socket path (default "+wire.DefaultSocket+"; ignored under socket activation)")
	group := fs.String("socket-group", "", "group owning the socket (mode 0660)")
	state := fs.String("state-dir", defaultStateDir(), "state directory")
	imgDir := fs.String("image", "", "image directory (default STATE/image)")
	auditPath := fs.String("audit-log", "", "audit log (default /var/log/vmgate/audit.jsonl if writable, else STATE/audit.jsonl)")
	maxVMs := fs.Int("max-vms", gateway.DefaultMaxVMs, "maximum live VMs")
	maxConns := fs.Int("max-conns-per-uid", gateway.DefaultMaxConnsPerUID, "maximum open connections to the socket per uid")
	queue := fs.Int("queue", gateway.DefaultQueueLen, "maximum requests waiting for a VM")
	queueWait := fs.Duration("queue-wait", gateway.DefaultQueueWait, "how long a request waits for a VM before it gets busy")
	grace := fs.Duration("grace", gateway.DefaultGrace, "how long running commands may finish on shutdown")
	accel := fs.String("accel", "auto", "accelerator: auto, kvm or tcg")
	metricsListen := fs.String("metrics-listen", "", "also serve Prometheus metrics (GET /metrics) on this loopback address, e.g. 127.0.0.1:9470 (they are always on the socket)")
	tbSize := fs.Int("tcg-tb-size", 0, "TCG translation buffer per VM in MiB (0: QEMU's default; docs/benchmarks.md)")
	seccompMode := fs.String("seccomp", "", "override the policy's [isolate] seccomp: required or off (a logged relaxation)")
	builtin := fs.Bool("builtin-policy", false, "use the embedded default policy, ignore "+DefaultConfig)
	allowRoot := fs.Bool("allow-root", false, "allow running as root (tests, containers)")
	noTemplate := fs.Bool("no-template", false, "boot every VM cold (no template snapshot, no pool)")
	pool := fs.Int("pool", gateway.DefaultPoolSize, "restored VMs to keep ready per VM shape (0: restore on demand)")
	ahead := fs.Int("ahead", gateway.DefaultAhead, "clones per VM shape launched ahead: QEMU up, waiting for a restore (0: none)")
	templateDir := fs.String("template-dir", "", "VM template directory (default STATE/templates)")
	netHosts := fs.String("net-hosts", "", "hosts(5)-style file pinning guest DNS names to addresses (checked before the host's resolver)")
	netstackSocket := fs.String("netstack-socket", "", "SOCK_SEQPACKET socket where systemd starts a netstack per networked VM (vmgate-netstack.socket); default: vmgated jails them itself")
	receiptKey := fs.String("receipt-key", "", "ed25519 key signing receipts and audit checkpoints (default STATE/"+receipt.DefaultKeyFile+", created at first start; a given FILE must exist; the daemon does not start without it)")
	cpEvery := fs.Int("audit-checkpoint-every", audit.DefaultCheckpointEvery, "sign the audit chain after this many records")
	cpInterval := fs.Duration("audit-checkpoint-interval", audit.DefaultCheckpointInterval, "and at least this often while records are written")
	var redact []string
	fs.StringArrayVar(&redact, "audit-redact", nil, "regular expression; matching argv elements are redacted in the audit log (repeatable)")
	fronts := frontFlags(fs)
	secretRoots := fs.String("secrets-roots", "", "PEM bundle the hosts of secrets are verified against (default: the host's, "+strings.Join(hostRoots, " or ")+")")
	level := fs.String("log-level", "info", "log level")
	return func(ctx context.Context, args []string) error {
		lvl, err := levelAndState(*level, *state)
		if err != nil {
			return err
		}
		a, err := vm.ParseAccel(*accel)
		if err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		cfg := gateway.Config{
			Socket: *socket, SocketGroup: *group, AuditPath: *auditPath,
			VM: vm.HostConfig{Runtime: vm.Runtime{StateDir: *state, TemplateDir: *templateDir, Accel: a, TCGTBSizeMiB: *tbSize},
				ImageDir: *imgDir, NoTemplate: *noTemplate, PoolSize: *pool, Ahead: *ahead},
			MaxVMs: *maxVMs, MaxConnsPerUID: *maxConns, QueueLen: *queue, QueueWait: *queueWait, Grace: *grace, MetricsListen: *metricsListen, AllowRoot: *allowRoot,
			Log: newLogger(os.Stderr, lvl), PolicyPath: *config, PolicyExplicit: *config != "", AuditRedact: redact, Seccomp: *seccompMode,
			ReceiptKey: *receiptKey, CheckpointEvery: *cpEvery, CheckpointInterval: *cpInterval,
		}
		if *cpEvery < 1 || *cpInterval <= 0 {
			return fmt.Errorf("%w: --audit-checkpoint-every must be 1 or more and --audit-checkpoint-interval positive", errUsage)
		}
		if err := fronts(&cfg); err != nil {
			return err
		}
		cfg.VM.NetstackSocket = *netstackSocket
		cfg.VM.SecretRoots = *secretRoots
		if *secretRoots == "" {
			cfg.VM.SecretRoots = firstFile(hostRoots)
		}
		if *netHosts != "" {
			h, err := netstack.LoadHosts(*netHosts)
			if err != nil {
				return err
			}
			cfg.NetHosts = h
		}
		if *pool < 0 {
			return fmt.Errorf("%w: --pool %d: must be 0 or more", errUsage, *pool)
		}
		switch {
		case *builtin && *config != "":
			return fmt.Errorf("%w: --builtin-policy and --config exclude each other", errUsage)
		case *builtin:
			cfg.PolicyPath = ""
		case cfg.PolicyPath == "":
			cfg.PolicyPath = DefaultConfig
		}
		if cfg.AuditPath == "" {
			if writable("/var/log/vmgate") {
				cfg.AuditPath = "/var/log/vmgate/audit.jsonl"
			} else {
				cfg.AuditPath = filepath.Join(*state, "audit.jsonl")
			}
		}
		return gateway.Run(ctx, cfg)
	}
}

// frontFlags defines the SSH and E2B front doors' flags; the function it
// returns sets them into a daemon's configuration.
func frontFlags(fs *pflag.FlagSet) func(*gateway.Config) error {
	var sshListen []string
	fs.StringArrayVar(&sshListen, "ssh-listen", nil, "serve SSH on IP:PORT (loopback) or unix:/PATH (repeatable; default off)")
	sshHostKey := fs.String("ssh-host-key", "", "SSH host key, created (ed25519, 0600) when missing (default STATE/"+sshfront.DefaultHostKey+")")
	sshKeys := fs.String("ssh-authorized-keys", DefaultSSHAuthorizedKeys, "authorized-keys file: each key names its policy profile with profile=\"NAME\"")
	sshRemote := fs.Bool("ssh-allow-remote", false, "allow --ssh-listen on non-loopback addresses (a logged relaxation)")
	sshSessions := fs.Int("ssh-max-sessions", 4, "SSH sessions (commands) one connection may run at once")
	sshIdle := fs.Duration("ssh-idle-timeout", 10*time.Minute, "close an SSH connection without sessions after this long")
	var e2bListen []string
	fs.StringArrayVar(&e2bListen, "e2b-listen", nil, "serve the E2B API on IP:PORT (loopback) or unix:/PATH (repeatable; default off; docs/e2b.md)")
	e2bKeys := fs.String("e2b-keys", DefaultE2BKeys, "E2B keys file: profile=\"NAME\" KEY per line (vmgated e2b key add)")
	e2bRemote := fs.Bool("e2b-allow-remote", false, "allow --e2b-listen on non-loopback addresses (a logged relaxation)")
	return func(cfg *gateway.Config) error {
		if len(sshListen) > 0 {
			if *sshSessions < 1 || *sshIdle <= 0 {
				return fmt.Errorf("%w: --ssh-max-sessions must be 1 or more and --ssh-idle-timeout positive", errUsage)
			}
			cfg.SSH = &sshfront.Config{Listen: sshListen, HostKey: *sshHostKey, AuthorizedKeys: *sshKeys,
				AllowRemote: *sshRemote, MaxSessions: *sshSessions, IdleTimeout: *sshIdle}
		}
		if len(e2bListen) > 0 {
			cfg.E2B = &e2bfront.Config{Listen: e2bListen, Keys: *e2bKeys, AllowRemote: *e2bRemote}
		}
		return nil
	}
}

// hostRoots are where distributions keep the host's CA bundle.
var hostRoots = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"}

// firstFile is the first of paths that exists, "" when none does.
func firstFile(paths []string) string {
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}
