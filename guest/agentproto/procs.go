package agentproto

import "strings"

// Background processes. A command run in the background outlives the
// host connection that started it: the agent keeps a table of them, with
// each one's output in bounded buffers, for the life of the guest. The
// table is the agent's, in the guest's memory, so that a pause, a resume
// and a fork carry it with the VM, and a restart of the host's daemon
// finds it again. The host names a process by the handle the agent gave
// it, never by its pid (pids are reused). Handles are 1, 2, 3, … in the
// order the agent took the processes; an agent that restarts (it crashed)
// starts again at 1 with an empty table.
//
// Every call below is a [FrameCall] whose argument and result are binary
// payloads (codec_procs.go), as the other calls' are: nothing is
// reflected on in the guest (codec.go says why). An agent without the
// feature [FeatureProcs] answers them with an error ("unknown call").
// A refusal's Reply.Error begins with one of the ProcErr codes, a colon
// and a space, then says more ([ProcErrorCode] splits it).

// FeatureProcs: the agent keeps background processes (CallProc*).
const FeatureProcs = "procs"

// Calls on background processes: the argument and the result.
const (
	CallProcStart  = "proc.start"  // ProcStart; ProcInfo
	CallProcList   = "proc.list"   // ProcListQuery; ProcList
	CallProcLogs   = "proc.logs"   // ProcLogs; ProcOutput
	CallProcInput  = "proc.input"  // ProcInput; no result
	CallProcSignal = "proc.signal" // ProcSignal; no result
)

// Bounds of the process table and of one call's reply. A reply stays
// within MaxGuestPayload: a ProcInfo is at most MaxInfoArgv + MaxProcDir
// + MaxUserName + a few hundred bytes, a ProcOutput that and at most
// MaxLogsChunk bytes in at most MaxLogsChunks chunks.
const (
	// MaxProcs bounds a table, whatever ProcStart.MaxProcs says.
	MaxProcs = 1024
	// MaxProcBuffer bounds one stream's buffer of one process;
	// DefaultProcBuffer is a buffer's size when ProcStart says none.
	MaxProcBuffer     = 64 << 20
	DefaultProcBuffer = 1 << 20
	// MaxLogsChunk bounds the output bytes one ProcOutput carries, and
	// MaxLogsChunks its chunks (a process that writes its streams a byte
	// at a time, in turns, makes a chunk per byte).
	MaxLogsChunk  = 40 << 10
	MaxLogsChunks = 512
	// MaxInputChunk bounds ProcInput.Data, and the input a process has
	// not read yet that the agent holds for it.
	MaxInputChunk = 1 << 20
	// MaxLogsWait bounds ProcLogs.WaitMS.
	MaxLogsWait = 60 * 1000
	// MaxInfoArgv bounds a ProcInfo's Argv: its strings' bytes and four
	// per string. A longer command line is cut (ProcInfo.ArgvCut).
	MaxInfoArgv = 2 << 10
	// MaxProcDir bounds ProcStart's Spec.Dir (PATH_MAX).
	MaxProcDir = 4096
)

// ProcStart starts a background process. It is refused (ProcErrLimit)
// when the table holds MaxProcs processes that still run; the table
// forgets the oldest ended ones past twice that many.
//
// A process that cannot be started (its user, its working directory or
// its program) is still taken: it has a handle, has exited with 126 or
// 127 as a command would, and its stderr says why.
type ProcStart struct {
	Spec ExecSpec
	// TimeoutMS ends the process, with every process of its session
	// (SIGKILL), that long after it started; 0: never.
	TimeoutMS int64
	// BufferBytes bounds each of its streams' buffers (at most
	// MaxProcBuffer; 0: DefaultProcBuffer): past it the oldest bytes go,
	// and are counted.
	BufferBytes int64
	// Stdin keeps a pipe to its standard input for ProcInput; without it
	// its input is /dev/null.
	Stdin bool
	// MaxProcs bounds the processes that run at once in the table (at
	// most, and 0: MaxProcs): the session's sessions.max_processes.
	MaxProcs int
}

// Process states (ProcInfo.State).
const (
	ProcRunning = "running"
	ProcExited  = "exited"
)

// Streams of a process's output (OutputChunk.Stream).
const (
	StreamStdout = 1
	StreamStderr = 2
)

// ProcInfo is a background process as the table has it.
type ProcInfo struct {
	Handle int64
	PID    int
	// Argv is its command line, cut to MaxInfoArgv (ArgvCut then says
	// so); User the account it runs as; Dir its working directory.
	Argv    []string
	ArgvCut bool `json:",omitempty"`
	User    string
	Dir     string
	State   string
	// Exit is how it ended, once it has (State ProcExited); TimedOut
	// says that ProcStart.TimeoutMS ended it.
	Exit     *Exit `json:",omitempty"`
	TimedOut bool  `json:",omitempty"`
	// Started and Ended are Unix times in nanoseconds (Ended 0 while it
	// runs).
	Started, Ended int64
	// Out and Err count the bytes it wrote to each stream in all;
	// OutDropped and ErrDropped those its buffers no longer hold.
	Out, Err               int64
	OutDropped, ErrDropped int64
	// Next is the offset of the next byte of its output (both streams,
	// in the order they came): ProcLogs.Since of a reader that has all.
	Next int64
	// StdinOpen says that its input pipe is open for ProcInput.
	StdinOpen bool `json:",omitempty"`
}

// ProcListQuery is the argument of CallProcList: the processes whose
// handles are greater than After (0: all).
type ProcListQuery struct {
	After int64
}

// ProcList is the result of CallProcList: processes of the table, oldest
// first, as many as one reply holds; More says that there are more, for a
// next call whose After is the last handle of this one. (A full table's
// entries do not fit in one reply: MaxGuestPayload.)
type ProcList struct {
	Procs []ProcInfo
	More  bool
}

// ProcLogs asks for a process's output from offset Since (0: the
// oldest kept): at most Max bytes (more is taken as MaxLogsChunk). With
// WaitMS, the reply waits, at most that long (at most MaxLogsWait), for
// output at or past Since, or the process's end, when there is none yet.
// With Max 0 it carries no output, and WaitMS waits for the process's end
// alone (a wait). A Since past the process's Next is refused
// (ProcErrInvalid).
type ProcLogs struct {
	Handle int64
	Since  int64
	Max    int64
	WaitMS int64
}

// ProcOutput is the result of CallProcLogs: the output from Since on, in
// chunks of one stream each, in the order the process wrote them; Next is
// where the next call goes on (Since when it carries none); Dropped counts
// the bytes between Since and the first chunk (or Next) that the buffers
// no longer hold. A gap between two chunks is output of the other stream
// that its buffer no longer holds. Info is the process now: once it says
// ProcExited, the process's output is complete (Info.Next is its end).
type ProcOutput struct {
	Chunks  []OutputChunk
	Next    int64
	Dropped int64
	Info    ProcInfo
}

// OutputChunk is a run of one stream's output at Offset of the process's
// output (both streams counted).
type OutputChunk struct {
	Stream int
	Offset int64
	Data   []byte
}

// ProcInput writes Data (at most MaxInputChunk bytes) to a process's
// input and then, with EOF, closes it. The agent queues the data and
// answers at once; when the process has not read MaxInputChunk bytes
// sent before, the call waits a few seconds for room, then is refused
// (ProcErrBusy) and none of Data is taken.
type ProcInput struct {
	Handle int64
	Data   []byte
	EOF    bool
}

// ProcSignal sends Signal (an RFC 4254 name: "TERM", "KILL", …) to a
// process's whole process group.
type ProcSignal struct {
	Handle int64
	Signal string
}

// Codes that begin a refused proc call's Reply.Error.
const (
	// ProcErrNoHandle: no process of the table has the handle (it never
	// had, or the table forgot it).
	ProcErrNoHandle = "no-handle"
	// ProcErrLimit: ProcStart found its MaxProcs processes running.
	ProcErrLimit = "limit"
	// ProcErrEnded: input or a signal for a process that has ended, or
	// input once its input is closed (or it was started without).
	ProcErrEnded = "ended"
	// ProcErrBusy: the process has not read the input already sent.
	ProcErrBusy = "busy"
	// ProcErrInvalid: the argument is malformed or out of bounds.
	ProcErrInvalid = "invalid"
)

// ProcErrorCode splits a proc call's Reply.Error into its code and the
// rest; a message without one of the codes has code "".
func ProcErrorCode(msg string) (code, detail string) {
	c, d, ok := strings.Cut(msg, ": ")
	switch c {
	case ProcErrNoHandle, ProcErrLimit, ProcErrEnded, ProcErrBusy, ProcErrInvalid:
		if ok {
			return c, d
		}
	}
	return "", msg
}
