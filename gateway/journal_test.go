package gateway

import (
	"testing"

	"github.com/coreos/go-systemd/v22/journal"

	"github.com/vmgate/vmgate/gateway/audit"
)

func TestJournalEntry(t *testing.T) {
	uid, code := uint32(1000), 7
	msg, prio, f := journalEntry(audit.Record{Kind: audit.KindExec, Seq: 3, UID: &uid, ExitCode: &code, Argv: []string{"sh", "-c", "exit 7"}, VMID: "abc"})
	if msg != "vmgate exec exit 7" || prio != journal.PriInfo {
		t.Fatalf("%q %v", msg, prio)
	}
	want := map[string]string{"VMGATE_KIND": "exec", "VMGATE_SEQ": "3", "VMGATE_UID": "1000", "VMGATE_EXIT_CODE": "7", "VMGATE_VM_ID": "abc", "VMGATE_ARGV": `["sh","-c","exit 7"]`}
	for k, v := range want {
		if f[k] != v {
			t.Errorf("%s = %q, want %q", k, f[k], v)
		}
	}
	if _, ok := f["VMGATE_RULE"]; ok {
		t.Error("empty fields must be left out")
	}
	msg, prio, f = journalEntry(audit.Record{Kind: audit.KindDecision, Verdict: audit.VerdictDeny, Rule: "deny[0] no-rm"})
	if msg != "vmgate decision deny" || prio != journal.PriNotice || f["VMGATE_RULE"] != "deny[0] no-rm" {
		t.Fatalf("%q %v %v", msg, prio, f)
	}
}
