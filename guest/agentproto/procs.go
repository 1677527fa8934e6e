package agentproto

// Background processes. A command run in the background outlives the
// host connection that started it: the agent keeps a table of them, with
// each one's output in bounded buffers, for the life of the guest. The
// table is the agent's, in the guest's memory, so that a pause, a resume
// and a fork carry it with the VM, and a restart of the host's daemon
// finds it again. The host names a process by the handle the agent gave
// it, never by its pid (pids are reused).
//
// Every call below is a [FrameCall] with a JSON argument and a JSON
// result, as the other calls are. An agent without the feature
// [FeatureProcs] answers them with an error ("unknown call").

// FeatureProcs: the agent keeps background processes (CallProc*).
const FeatureProcs = "procs"

// Calls on background processes: the argument and the result.
const (
	CallProcStart  = "proc.start"  // ProcStart; ProcInfo
	CallProcList   = "proc.list"   // no argument; ProcList
	CallProcLogs   = "proc.logs"   // ProcLogs; ProcOutput
	CallProcInput  = "proc.input"  // ProcInput; no result
	CallProcSignal = "proc.signal" // ProcSignal; no result
)

// Bounds of the process table and of one call's reply.
const (
	// MaxProcs bounds a table, whatever ProcStart.MaxProcs says.
	MaxProcs = 1024
	// MaxProcBuffer bounds one stream's buffer of one process.
	MaxProcBuffer = 64 << 20
	// MaxLogsChunk bounds the output bytes one ProcOutput carries, so
	// that its JSON (base64) stays within MaxGuestPayload.
	MaxLogsChunk = 40 << 10
	// MaxInputChunk bounds ProcInput.Data.
	MaxInputChunk = 1 << 20
	// MaxLogsWait bounds ProcLogs.WaitMS.
	MaxLogsWait = 60 * 1000
)

// ProcStart starts a background process. It is refused (an error reply)
// when the table holds MaxProcs processes that still run; the table
// forgets the oldest ended ones past that.
type ProcStart struct {
	Spec ExecSpec
	// TimeoutMS ends the process, with every process of its session
	// (SIGKILL), that long after it started; 0: never.
	TimeoutMS int64
	// BufferBytes bounds each of its streams' buffers (at most
	// MaxProcBuffer): past it the oldest bytes go, and are counted.
	BufferBytes int64
	// Stdin keeps a pipe to its standard input for ProcInput; without it
	// its input is /dev/null.
	Stdin bool
	// MaxProcs bounds the processes that run at once in the table (at
	// most MaxProcs): the session's sessions.max_processes.
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
	Argv   []string
	User   string
	Dir    string
	State  string
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

// ProcList is the result of CallProcList: every process of the table,
// oldest first.
type ProcList struct {
	Procs []ProcInfo
}

// ProcLogs asks for a process's output from offset Since (0: the
// oldest kept): at most Max bytes (at most MaxLogsChunk). With WaitMS,
// the reply waits, at most that long (at most MaxLogsWait), for output at
// or past Since, or the process's end, when there is none yet. With Max
// 0 it carries no output, and WaitMS waits for the process's end alone
// (a wait).
type ProcLogs struct {
	Handle int64
	Since  int64
	Max    int64
	WaitMS int64
}

// ProcOutput is the result of CallProcLogs: the output from Since on, in
// chunks of one stream each, in the order the process wrote them; Next is
// where the next call goes on; Dropped counts the bytes between Since and
// the first chunk that the buffers no longer hold. Info is the process now
// (its end included, once the last chunk has been read).
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

// ProcInput writes Data to a process's input and, with EOF, closes it.
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
