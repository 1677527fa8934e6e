package agentbench

import (
	"context"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/gateway/client/shelltool"
)

// Why an agent stopped.
const (
	StopDone     = "done"            // the agent declared success (the done tool)
	StopStopped  = "stopped"         // it answered without a tool call, or did nothing
	StopTurns    = "turns_exhausted" // max_turns model responses used
	StopTimeout  = "timeout"         // agent_time_limit reached
	StopError    = "error"           // the endpoint failed (after retries) or the harness did
	StopCanceled = "canceled"        // the run was interrupted
)

// Env is what an agent may use during one trial.
type Env struct {
	Instruction string
	MaxTurns    int
	// Shell runs one exec_shell_command call in the trial's VM.
	Shell func(ctx context.Context, a shelltool.Args) shelltool.Outcome
	// Script runs a script (bash, on stdin) in the trial's VM; the oracle
	// uses it for solve.sh.
	Script func(ctx context.Context, script []byte, limit time.Duration) (output string, exit int, err error)
	Solve  []byte
	// Trace records one event of the trial's trace (never nil).
	Trace func(kind string, fields map[string]any)
}

// AgentResult is what an agent reports.
type AgentResult struct {
	Stop             string `json:"stop_reason"`
	Turns            int    `json:"turns"`
	ToolCalls        int    `json:"tool_calls"`
	InvalidToolCalls int    `json:"invalid_tool_calls"`
	TextToolCalls    int    `json:"text_tool_calls"`
	PromptTokens     int    `json:"prompt_tokens"`
	CompletionTokens int    `json:"completion_tokens"`
	Err              string `json:"agent_error,omitempty"`
}

// Agent works on a trial. Run returns when the agent stops or ctx ends
// (the runner sets ctx's deadline to the scenario's agent time limit).
type Agent interface {
	Name() string
	Run(ctx context.Context, env *Env) AgentResult
}

// Oracle runs the scenario's reference fix: a scenario it does not
// resolve is broken.
type Oracle struct{}

// Name implements Agent.
func (Oracle) Name() string { return "oracle" }

// Run implements Agent.
func (Oracle) Run(ctx context.Context, env *Env) AgentResult {
	limit := time.Until(deadlineOr(ctx, time.Now().Add(10*time.Minute)))
	out, code, err := env.Script(ctx, env.Solve, limit)
	env.Trace("solve", map[string]any{"exit_code": code, "output": out, "error": errString(err)})
	r := AgentResult{Stop: StopDone, Turns: 1, ToolCalls: 1}
	switch {
	case ctx.Err() != nil:
		r.Stop = StopTimeout
	case err != nil:
		r.Stop, r.Err = StopError, err.Error()
	case code != 0:
		r.Stop, r.Err = StopError, fmt.Sprintf("solve.sh exited %d", code)
	}
	return r
}

// Noop does nothing: a scenario it resolves is not broken.
type Noop struct{}

// Name implements Agent.
func (Noop) Name() string { return "noop" }

// Run implements Agent.
func (Noop) Run(context.Context, *Env) AgentResult { return AgentResult{Stop: StopStopped} }

func deadlineOr(ctx context.Context, def time.Time) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return def
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
