package imagebuild

import (
	"fmt"
	"os"
	"path"

	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/vm/image"
)

// An imported root may keep its own init instead of having the agent as
// init (vmgated image import --init image): an image made to run
// services under systemd (a task whose fix is `systemctl restart nginx`)
// keeps them. Only systemd is kept: vmgate starts the agent and the
// guest's network as systemd units, so an init it cannot write units for
// is refused at import, with the way out (--init agent).
//
// What the import adds to such a root, beside what every import adds:
//   - the agent's unit (the one vmgate's own build has), wanted by
//     sysinit.target: the agent runs early, needing only local file
//     systems;
//   - a network unit running "vmgate-agent network" (the agent-as-init's
//     own network setup, by interface index, so a rename by udev cannot
//     undo it) before network-pre.target: the image needs no network
//     manager of its own, and one it has may take over later;
//   - masks for the units vmgate's build masks too: gettys on the serial
//     console that vmgate reads, timers and waits that only slow a
//     disposable VM's boot;
//   - an /etc/fstab that names the VM's root disk, as vmgate's build has:
//     the image's names devices a VM does not have, and systemd would
//     wait for them.
// The root's marker (agentproto.RootInitMarker) is removed if it has one.

// Init modes of an import (ImportOptions.Init).
const (
	InitAgent = "agent" // the agent is the root's init (the default)
	InitImage = "image" // the root's own systemd is
)

// initInput is Inputs.Init of an import's init mode, or an error for a
// mode that is none.
func initInput(mode string) (string, error) {
	switch mode {
	case "", InitAgent:
		return "", nil
	case InitImage:
		return image.InitSystemd, nil
	}
	return "", fmt.Errorf("image import: --init %q: must be %s (the agent is the root's init) or %s (the root's own systemd is)", mode, InitAgent, InitImage)
}

// Units an import that keeps systemd writes.
const (
	agentUnitPath   = "/etc/systemd/system/vmgate-agent.service"
	networkUnitPath = "/etc/systemd/system/vmgate-network.service"
)

// networkUnit configures the guest's NIC before the image's network
// units run.
const networkUnit = `[Unit]
Description=vmgate guest network
DefaultDependencies=no
After=systemd-udevd.service
Before=network-pre.target vmgate-agent.service shutdown.target
Wants=network-pre.target
Conflicts=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=` + agentproto.AgentBinaryPath + ` ` + agentproto.NetworkCommand + `

[Install]
WantedBy=sysinit.target
`

// systemdLinks are the links that enable vmgate's units and mask the
// units that slow or block a VM's boot (maskedUnits).
func systemdLinks() []rootLink {
	links := []rootLink{
		{"/etc/systemd/system/sysinit.target.wants/vmgate-agent.service", agentUnitPath},
		{"/etc/systemd/system/sysinit.target.wants/vmgate-network.service", networkUnitPath},
	}
	for _, u := range maskedUnits {
		links = append(links, rootLink{"/etc/systemd/system/" + u, "/dev/null"})
	}
	return links
}

// checkSystemd checks that the root r's /sbin/init is systemd: the file
// it leads to, followed as the guest would (statIn), is named systemd.
func checkSystemd(r *os.Root) error {
	const sbinInit = "sbin/init"
	target, err := resolveIn(r, sbinInit)
	if err == nil {
		var fi os.FileInfo
		if fi, err = r.Lstat(target); err == nil && !fi.Mode().IsRegular() {
			err = fmt.Errorf("/%s is not a file", target)
		}
	}
	if err != nil {
		return fmt.Errorf("--init %s keeps the root's systemd, but /sbin/init cannot be used: %w (import with --init %s: the agent is then the init)", InitImage, err, InitAgent)
	}
	if path.Base(target) != "systemd" {
		return fmt.Errorf("--init %s keeps only systemd (vmgate starts its agent as a systemd unit), and /sbin/init is /%s (import with --init %s: the agent is then the init)", InitImage, target, InitAgent)
	}
	return nil
}
