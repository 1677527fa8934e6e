# vmgated on every Nomad client: a system job, one allocation per node.
# docs/scale-out.md says what stays on the node and how agents find it.
#
# Needs on each node (Nomad does not provide them):
#   - `make install` run there with --no-start (contrib/install.sh --no-start):
#     /usr/local/bin/vmgated, user vmgate, group vmgate-users, the guest
#     image in /var/lib/vmgate/image, /etc/vmgate/vmgate.toml. Do not also
#     enable vmgated.service: one daemon per state directory.
#   - qemu-system-x86 and qemu-utils (make deps); /dev/kvm where available.
#   - the raw_exec driver enabled in the client configuration:
#       plugin "raw_exec" { config { enabled = true } }
#     and the Nomad client running as root: raw_exec can only start the
#     task as another user (user = "vmgate" below) then; vmgated refuses to
#     run as root without --allow-root, on purpose.
#
# Why raw_exec: vmgated builds its own jail for each VM (user, mount, pid,
# net, ipc, uts and cgroup namespaces, pivot_root, seccomp) and needs the
# host's /proc, QEMU and /dev/kvm. The exec driver's chroot and namespaces
# would sit in its way without adding to that isolation. raw_exec adds
# none either: the task runs as user vmgate (below), without capabilities,
# and the jail is the boundary, as under systemd. The systemd unit's
# sandbox (ProtectSystem=, SystemCallFilter=, ...) does not apply here: on
# systemd hosts prefer vmgated.service.
#
# Cgroups: Nomad places the task in a cgroup it owns and does not delegate
# to user vmgate, so vmgated cannot make per-VM cgroups and logs
# "RELAXATION: no cgroup for the jails"; each QEMU is then bounded by
# rlimits, and the task's resources below bound them all. To get per-VM
# cgroups, create a cgroup v2 directory and chown it, its cgroup.procs,
# cgroup.threads and cgroup.subtree_control to vmgate (what systemd's
# Delegate=yes does), and name it in the config block with
# cgroup_v2_override. Set isolate.cgroups = "required" in the policy to
# refuse to run without.
#
# Not tested here: the build machines have no Nomad (not even
# `nomad job validate` was run on this file).

job "vmgated" {
  type = "system"

  group "vmgated" {
    # Restart in place; a node-local daemon never moves to another node.
    restart {
      attempts = 10
      interval = "30m"
      delay    = "5s"
      mode     = "delay"
    }

    task "vmgated" {
      driver = "raw_exec"
      user   = "vmgate"

      config {
        command = "/usr/local/bin/vmgated"
        # The same flags as vmgated.service, plus the socket vmgated makes
        # itself (no socket activation here) and hands to vmgate-users.
        args = [
          "serve",
          "--config", "/etc/vmgate/vmgate.toml",
          "--socket", "/run/vmgate/vmgate.sock",
          "--socket-group", "vmgate-users",
          "--state-dir", "/var/lib/vmgate",
          "--image", "/var/lib/vmgate/image",
          "--audit-log", "/var/log/vmgate/audit.jsonl",
        ]
      }

      # SIGTERM: running commands get --grace (10 s), then every VM is
      # destroyed. Give it time before Nomad sends SIGKILL.
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      # For the daemon and all its VMs: with the default --max-vms 4 and
      # the default profile (512 MiB, 1 CPU each), plus the daemon.
      resources {
        cpu    = 4000 # MHz
        memory = 3072 # MiB
      }
    }
  }
}
