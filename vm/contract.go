package vm

import "github.com/vmgate/vmgate/guest/agentproto"

// The guest contract as the daemon sees it. The vm package is the one
// layer that speaks to the guest agent; callers above it (the gateway)
// name these types and constants through vm, so a change of the wire
// contract stays behind this package's methods.
type (
	// ExecSpec is what a command runs: argv, environment, directory, user.
	ExecSpec = agentproto.ExecSpec
	// ProcStartRequest starts a background process (VM.ProcStart).
	ProcStartRequest = agentproto.ProcStart
	// ProcInfo describes a background process.
	ProcInfo = agentproto.ProcInfo
	// ProcLogsRequest asks for a background process's output (VM.ProcLogs).
	ProcLogsRequest = agentproto.ProcLogs
	// ProcOutput is one answer to ProcLogs.
	ProcOutput = agentproto.ProcOutput
	// FileEntry describes one file of the guest (VM.FSStat, VM.FSList).
	FileEntry = agentproto.FileEntry
)

const (
	// FeatureProcs: the agent keeps background processes.
	FeatureProcs = agentproto.FeatureProcs
	// FeatureFS: the agent does file operations.
	FeatureFS = agentproto.FeatureFS
	// ProcRunning and ProcExited are a ProcInfo's states.
	ProcRunning = agentproto.ProcRunning
	ProcExited  = agentproto.ProcExited
	// StreamStdout and StreamStderr name a ProcOutput chunk's stream.
	StreamStdout = agentproto.StreamStdout
	StreamStderr = agentproto.StreamStderr
	// MaxLogsChunk bounds the bytes one ProcOutput carries.
	MaxLogsChunk = agentproto.MaxLogsChunk
	// MaxLogsWait bounds ProcLogsRequest.WaitMS (milliseconds).
	MaxLogsWait = agentproto.MaxLogsWait
	// FileRegular is a FileEntry's Type for a regular file.
	FileRegular = agentproto.FileRegular
)
