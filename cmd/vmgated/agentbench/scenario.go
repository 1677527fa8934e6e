// Package agentbench is vmgate's agent benchmark: can an agent (a local
// LLM behind an OpenAI-compatible endpoint, or the reference solutions)
// fix a deliberately broken Linux server in a VM?
//
// A scenario (docs/scenarios.md) is a directory with scenario.toml and four
// scripts: inject.sh breaks a fresh VM, check.sh probes whether the fault
// is fixed as a user would see it, guards.sh checks what must still hold
// (no "fix" by removing the thing), solve.sh is a reference fix. A trial
// runs every step through vmgated like any other client: a session VM
// under the bench policy, every command audited. The agent only ever sees
// the instruction and what its own commands print; check, guard and
// solve scripts reach the VM only after the agent has stopped (on the
// command's stdin, never left on its disk), so it can neither read nor
// tamper with them.
package agentbench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Script names in a scenario directory.
const (
	InjectScript = "inject.sh"
	CheckScript  = "check.sh"
	GuardsScript = "guards.sh"
	SolveScript  = "solve.sh"
	// LibScript, in the scenarios directory (not a scenario's), is
	// prepended to every script: the helpers check and guard scripts use
	// to report (pass, fail, finish).
	LibScript = "lib.sh"
)

// Scenario is one benchmark task.
type Scenario struct {
	ID          string
	Title       string
	Category    string
	Difficulty  string
	Instruction string // what the agent is told: symptoms, never the cause
	MaxTurns    int
	AgentLimit  time.Duration // wall time the agent may use
	Settle      time.Duration // wait after the agent stops, before checking
	VerifyLimit time.Duration // time limit of check.sh and guards.sh each
	Network     string        // "none" (the only mode so far)
	// Protect lists guest files whose content must not change between
	// the end of inject.sh and the verification: their SHA-256 is taken
	// before the agent starts and kept on the host.
	Protect []string

	Dir                          string
	Inject, Check, Guards, Solve []byte // scripts, lib.sh prepended
}

// Difficulties in order.
var Difficulties = []string{"easy", "medium", "hard"}

type scenarioFile struct {
	ID          string   `toml:"id"`
	Title       string   `toml:"title"`
	Category    string   `toml:"category"`
	Difficulty  string   `toml:"difficulty"`
	Instruction string   `toml:"instruction"`
	MaxTurns    int      `toml:"max_turns"`
	AgentLimit  string   `toml:"agent_time_limit"`
	Settle      string   `toml:"settle_time"`
	VerifyLimit string   `toml:"verifier_time_limit"`
	Network     string   `toml:"network"`
	Protect     []string `toml:"protect"`
}

var (
	idRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,47}$`)
	pathRE = regexp.MustCompile(`^/[A-Za-z0-9._/@+-]+$`)
)

// ParseScenario decodes and validates scenario.toml. Unknown keys are
// errors; defaults: 30 turns, 10m agent time, 2s settle, 60s verifier,
// network "none".
func ParseScenario(data []byte) (*Scenario, error) {
	var f scenarioFile
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&f)
	if err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			return nil, fmt.Errorf("%s", perr.ErrorWithPosition())
		}
		return nil, err
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("unknown keys: %s", strings.Join(keys, ", "))
	}
	s := &Scenario{ID: f.ID, Title: strings.TrimSpace(f.Title), Category: f.Category, Difficulty: f.Difficulty,
		Instruction: strings.TrimSpace(f.Instruction), MaxTurns: f.MaxTurns, Network: f.Network, Protect: f.Protect}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(idRE.MatchString(s.ID), "id %q: want lower-case letters, digits and dashes (at most 48)", s.ID)
	check(s.Title != "", "title is empty")
	check(idRE.MatchString(s.Category), "category %q: want lower-case letters, digits and dashes", s.Category)
	check(slices.Contains(Difficulties, s.Difficulty), "difficulty %q: want one of %s", s.Difficulty, strings.Join(Difficulties, ", "))
	check(s.Instruction != "", "instruction is empty")
	if s.MaxTurns == 0 {
		s.MaxTurns = 30
	}
	check(s.MaxTurns >= 1 && s.MaxTurns <= 500, "max_turns %d: want 1 to 500", s.MaxTurns)
	dur := func(name, v string, def, lo, hi time.Duration) time.Duration {
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < lo || d > hi {
			errs = append(errs, fmt.Errorf("%s %q: want a duration from %v to %v", name, v, lo, hi))
		}
		return d
	}
	s.AgentLimit = dur("agent_time_limit", f.AgentLimit, 10*time.Minute, time.Second, 4*time.Hour)
	s.Settle = dur("settle_time", f.Settle, 2*time.Second, 0, 10*time.Minute)
	s.VerifyLimit = dur("verifier_time_limit", f.VerifyLimit, time.Minute, time.Second, 30*time.Minute)
	if s.Network == "" {
		s.Network = "none"
	}
	check(s.Network == "none", "network %q: only \"none\" is supported (VMs of the benchmark have no NIC)", s.Network)
	for _, p := range s.Protect {
		check(pathRE.MatchString(p) && !strings.Contains(p, "/../") && !strings.HasSuffix(p, "/.."),
			"protect %q: want an absolute path of plain characters", p)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

// LoadScenario reads one scenario directory; lib is prepended to its
// scripts.
func LoadScenario(dir string, lib []byte) (*Scenario, error) {
	data, err := os.ReadFile(filepath.Join(dir, "scenario.toml"))
	if err != nil {
		return nil, err
	}
	s, err := ParseScenario(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "scenario.toml"), err)
	}
	if base := filepath.Base(dir); base != s.ID {
		return nil, fmt.Errorf("%s: id %q differs from the directory name %q", dir, s.ID, base)
	}
	s.Dir = dir
	for name, dst := range map[string]*[]byte{InjectScript: &s.Inject, CheckScript: &s.Check, GuardsScript: &s.Guards, SolveScript: &s.Solve} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("scenario %s: %w", s.ID, err)
		}
		*dst = withLib(lib, b)
	}
	return s, nil
}

// withLib prepends lib to a script, keeping the script's own shebang line
// meaningless (scripts run as `bash -s` with the text on stdin).
func withLib(lib, script []byte) []byte {
	var b bytes.Buffer
	b.WriteString("set -u\n")
	b.Write(lib)
	b.WriteString("\n# ---- scenario script ----\n")
	b.Write(script)
	return b.Bytes()
}

// LoadScenarios reads every scenario directory under root (those holding a
// scenario.toml), sorted by id; only, when not empty, keeps those ids
// (and fails on an unknown one).
func LoadScenarios(root string, only []string) ([]*Scenario, error) {
	lib, err := os.ReadFile(filepath.Join(root, LibScript))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var out []*Scenario
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(root, e.Name())
		if _, err := os.Stat(filepath.Join(dir, "scenario.toml")); err != nil {
			continue
		}
		if len(only) > 0 && !slices.Contains(only, e.Name()) {
			continue
		}
		s, err := LoadScenario(dir, lib)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	for _, id := range only {
		if !slices.ContainsFunc(out, func(s *Scenario) bool { return s.ID == id }) {
			return nil, fmt.Errorf("no scenario %q in %s", id, root)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no scenarios in %s (directories with a scenario.toml)", root)
	}
	return out, nil
}
