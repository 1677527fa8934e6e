package e2bfront

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// The messages of the sandbox side's two services, process.Process and
// filesystem.Filesystem, as typed structs in the JSON form of protobuf:
// lowerCamelCase names, 64-bit integers as strings, bytes as standard
// base64, enums by name, times as RFC 3339. A client's unknown fields are
// ignored. (No protobuf toolchain is needed to read or change them; the
// tests hold the JSON they make to the form the SDKs read.)

// processConfig is what a process runs.
type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args"`
	Envs map[string]string `json:"envs"`
	Cwd  *string           `json:"cwd,omitempty"`
}

type ptySize struct {
	Cols uint32 `json:"cols"`
	Rows uint32 `json:"rows"`
}

type ptyConfig struct {
	Size *ptySize `json:"size,omitempty"`
}

// processSelector names a process: by pid (the SDKs' way) or tag.
type processSelector struct {
	PID *uint32 `json:"pid,omitempty"`
	Tag *string `json:"tag,omitempty"`
}

type startRequest struct {
	Process *processConfig `json:"process"`
	PTY     *ptyConfig     `json:"pty,omitempty"`
	Tag     *string        `json:"tag,omitempty"`
	Stdin   *bool          `json:"stdin,omitempty"`
}

type connectRequest struct {
	Process *processSelector `json:"process"`
}

type processInput struct {
	Stdin []byte `json:"stdin,omitempty"`
	PTY   []byte `json:"pty,omitempty"`
}

type sendInputRequest struct {
	Process *processSelector `json:"process"`
	Input   *processInput    `json:"input"`
}

type sendSignalRequest struct {
	Process *processSelector `json:"process"`
	Signal  signalName       `json:"signal"`
}

type updateRequest struct {
	Process *processSelector `json:"process"`
	PTY     *ptyConfig       `json:"pty,omitempty"`
}

type closeStdinRequest struct {
	Process *processSelector `json:"process"`
}

type processInfo struct {
	Config processConfig `json:"config"`
	PID    uint32        `json:"pid"`
	Tag    *string       `json:"tag,omitempty"`
}

type listResponse struct {
	Processes []processInfo `json:"processes"`
}

// processEvent is one message of a Start or Connect stream: exactly one
// of its fields is set.
type processEvent struct {
	Event eventOneof `json:"event"`
}

type eventOneof struct {
	Start     *startEvent `json:"start,omitempty"`
	Data      *dataEvent  `json:"data,omitempty"`
	End       *endEvent   `json:"end,omitempty"`
	Keepalive *struct{}   `json:"keepalive,omitempty"`
}

type startEvent struct {
	PID uint32 `json:"pid"`
}

type dataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	PTY    []byte `json:"pty,omitempty"`
}

type endEvent struct {
	ExitCode int32   `json:"exitCode"`
	Exited   bool    `json:"exited"`
	Status   string  `json:"status"`
	Error    *string `json:"error,omitempty"`
}

// signalName is the Signal enum; it reads a name or a number.
type signalName string

const (
	signalTerm = "SIGNAL_SIGTERM"
	signalKill = "SIGNAL_SIGKILL"
)

func (s *signalName) UnmarshalJSON(b []byte) error {
	var name string
	if err := json.Unmarshal(b, &name); err == nil {
		*s = signalName(name)
		return nil
	}
	var n int
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("signal: want a name or a number")
	}
	switch n {
	case 9:
		*s = signalKill
	case 15:
		*s = signalTerm
	default:
		*s = signalName("SIGNAL_" + strconv.Itoa(n))
	}
	return nil
}

// Filesystem messages.

type pathRequest struct {
	Path string `json:"path"`
}

type listDirRequest struct {
	Path  string `json:"path"`
	Depth uint32 `json:"depth"`
}

type moveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

// File types (EntryInfo.type).
const (
	fileTypeFile      = "FILE_TYPE_FILE"
	fileTypeDirectory = "FILE_TYPE_DIRECTORY"
	fileTypeSymlink   = "FILE_TYPE_SYMLINK"
)

type entryInfo struct {
	Name          string    `json:"name"`
	Type          string    `json:"type"`
	Path          string    `json:"path"`
	Size          int64     `json:"size,string"`
	Mode          uint32    `json:"mode"`
	Permissions   string    `json:"permissions"`
	Owner         string    `json:"owner"`
	Group         string    `json:"group"`
	ModifiedTime  time.Time `json:"modifiedTime"`
	SymlinkTarget *string   `json:"symlinkTarget,omitempty"`
}

type entryResponse struct {
	Entry *entryInfo `json:"entry"`
}

type listDirResponse struct {
	Entries []entryInfo `json:"entries"`
}

// writtenFile is one entry of POST /files's answer.
type writtenFile struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}
