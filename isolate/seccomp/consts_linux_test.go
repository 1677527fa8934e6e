//go:build linux

package seccomp

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestConsts_MatchUnix(t *testing.T) {
	for name, c := range map[string][2]uint64{
		"AF_UNIX":             {afUNIX, unix.AF_UNIX},
		"AF_INET":             {afINET, unix.AF_INET},
		"AF_INET6":            {afINET6, unix.AF_INET6},
		"CLONE_THREAD":        {cloneThread, unix.CLONE_THREAD},
		"CLONE_NEWNS":         {cloneNewNS, unix.CLONE_NEWNS},
		"CLONE_NEWCGROUP":     {cloneNewCgroup, unix.CLONE_NEWCGROUP},
		"CLONE_NEWUTS":        {cloneNewUTS, unix.CLONE_NEWUTS},
		"CLONE_NEWIPC":        {cloneNewIPC, unix.CLONE_NEWIPC},
		"CLONE_NEWUSER":       {cloneNewUser, unix.CLONE_NEWUSER},
		"CLONE_NEWPID":        {cloneNewPID, unix.CLONE_NEWPID},
		"CLONE_NEWNET":        {cloneNewNet, unix.CLONE_NEWNET},
		"PR_SET_TIMERSLACK":   {prSetTimerslack, unix.PR_SET_TIMERSLACK},
		"PR_MCE_KILL":         {prMCEKill, unix.PR_MCE_KILL},
		"PR_SET_NO_NEW_PRIVS": {prSetNoNewPrivs, unix.PR_SET_NO_NEW_PRIVS},
		"SOL_SOCKET":          {solSocket, unix.SOL_SOCKET},
		"SOL_TCP":             {solTCP, unix.SOL_TCP},
		"SO_ZEROCOPY":         {soZerocopy, unix.SO_ZEROCOPY},
		"TCP_NODELAY":         {tcpNodelay, unix.TCP_NODELAY},
		"EPERM":               {uint64(errEPERM), uint64(unix.EPERM)},
		"ENOSYS":              {uint64(errENOSYS), uint64(unix.ENOSYS)},
	} {
		if c[0] != c[1] {
			t.Errorf("%s = %#x, x/sys/unix says %#x", name, c[0], c[1])
		}
	}
}
