package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/vmgate/vmgate/cmd/vmgated/agentbench"
	"github.com/vmgate/vmgate/vm"
)

// benchAgent runs the agent benchmark (docs/scenarios.md).
func benchAgent(fs *pflag.FlagSet) runFunc {
	scen := fs.String("scenarios", "scenarios", "scenarios directory")
	only := fs.String("only", "", "comma-separated scenario ids (default: all)")
	agentName := fs.String("agent", "openai", "agent: openai, oracle (runs solve.sh) or noop (does nothing)")
	endpoint := fs.String("endpoint", "http://127.0.0.1:8080", "OpenAI-compatible endpoint (openai agent)")
	model := fs.String("model", "", "model name sent to the endpoint (openai agent)")
	keyEnv := fs.String("api-key-env", "OPENAI_API_KEY", "environment variable holding the endpoint's API key, if any")
	temperature := fs.String("temperature", "", "sampling temperature (default: the server's)")
	topP := fs.String("top-p", "", "nucleus sampling top_p (default: the server's)")
	maxTokens := fs.Int("max-tokens", 0, "max tokens per response (default: the server's)")
	stream := fs.Bool("stream", false, "stream responses (server-sent events)")
	runs := fs.Int("runs", 1, "trials per scenario (the k of pass@k)")
	fork := fs.Bool("fork", false, "inject each scenario's fault once and fork the broken VM into --runs copies, one trial each")
	parallel := fs.Int("parallel", 1, "trials at once (each is a VM)")
	seed := fs.Int64("seed", 1, "seed: trial order and the endpoint's sampling seed (seed+run-1 per run)")
	out := fs.String("out", "", "output directory, must not hold results yet (default bench-agent-TIMESTAMP)")
	socket := fs.String("socket", "", "use this running vmgated (default: start one in-process on the bench policy)")
	state := fs.String("state-dir", defaultStateDir(), "state directory (the in-process daemon's scratch state goes inside)")
	imgDir := fs.String("image", "", "image directory (default STATE/image)")
	templateDir := fs.String("template-dir", "", "template directory (default STATE/templates)")
	memory := fs.Int("memory", 512, "guest memory in MiB (in-process daemon)")
	accel := fs.String("accel", "auto", "accelerator: auto, kvm or tcg")
	level := fs.String("log-level", "warn", "log level")
	return func(ctx context.Context, args []string) error {
		lvl, err := levelAndState(*level, *state)
		if err != nil {
			return err
		}
		var ids []string
		if *only != "" {
			ids = strings.Split(*only, ",")
		}
		scenarios, err := agentbench.LoadScenarios(*scen, ids)
		if err != nil {
			return err
		}
		a, err := vm.ParseAccel(*accel)
		if err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		if *runs < 1 || *parallel < 1 || *parallel > 64 {
			return fmt.Errorf("%w: --runs must be at least 1, --parallel from 1 to 64", errUsage)
		}
		sampling, err := parseSampling(*agentName == "openai", *seed, *temperature, *topP, *maxTokens)
		if err != nil {
			return err
		}
		o := agentbench.Options{Scenarios: scenarios, AgentName: *agentName, Runs: *runs, Parallel: *parallel, Seed: *seed,
			Socket: *socket, StateDir: *state, ImageDir: *imgDir, TemplateDir: *templateDir, Accel: a, MemoryMiB: *memory, Fork: *fork,
			Log: newLogger(os.Stderr, lvl), Progress: progressTo(newLogger(os.Stderr, lvl))}
		switch *agentName {
		case "oracle":
			o.NewAgent = func(int, agentbench.Sampling) agentbench.Agent { return agentbench.Oracle{} }
		case "noop":
			o.NewAgent = func(int, agentbench.Sampling) agentbench.Agent { return agentbench.Noop{} }
		case "openai":
			o.Model, o.Endpoint, o.Sampling, o.Stream = *model, *endpoint, sampling, *stream
			key := os.Getenv(*keyEnv)
			o.NewAgent = func(_ int, s agentbench.Sampling) agentbench.Agent {
				return &agentbench.OpenAI{Endpoint: *endpoint, Model: *model, APIKey: key, Sampling: s, Stream: *stream}
			}
		default:
			return fmt.Errorf("%w: --agent %q: want openai, oracle or noop", errUsage, *agentName)
		}
		if o.ImageDir == "" {
			o.ImageDir = defaultImageDir(*state)
		}
		if o.TemplateDir == "" {
			o.TemplateDir = filepath.Join(*state, "templates")
		}
		if *out == "" {
			*out = "bench-agent-" + time.Now().UTC().Format("20060102-150405")
		}
		o.Out = *out
		fmt.Fprintf(os.Stderr, "vmgated bench agent: %d scenarios × %d runs, agent %s, %d at once; results in %s\n",
			len(scenarios), *runs, *agentName, *parallel, *out)
		return runBenchAgent(ctx, o)
	}
}

// parseSampling reads the sampling flags; the seed is sent only to an
// endpoint (the openai agent).
func parseSampling(endpoint bool, seed int64, temperature, topP string, maxTokens int) (agentbench.Sampling, error) {
	sampling := agentbench.Sampling{MaxTokens: maxTokens}
	if endpoint {
		sampling.Seed = &seed
	}
	for _, f := range []struct {
		name, v string
		dst     **float64
	}{{"--temperature", temperature, &sampling.Temperature}, {"--top-p", topP, &sampling.TopP}} {
		if f.v == "" {
			continue
		}
		var x float64
		if _, err := fmt.Sscan(f.v, &x); err != nil || x < 0 || x > 2 {
			return sampling, fmt.Errorf("%w: %s %q: want a number from 0 to 2", errUsage, f.name, f.v)
		}
		*f.dst = &x
	}
	return sampling, nil
}

// runBenchAgent runs the trials and writes the report.
func runBenchAgent(ctx context.Context, o agentbench.Options) error {
	s, err := agentbench.Run(ctx, o)
	if err != nil {
		return err
	}
	results, err := agentbench.ReadResults(o.Out)
	if err != nil {
		return err
	}
	if err := agentbench.WriteReport(o.Out, s, results); err != nil {
		return err
	}
	fmt.Println()
	agentbench.WriteMarkdown(os.Stdout, s, nil)
	fmt.Printf("\nReport: %s\n", filepath.Join(o.Out, "report.html"))
	return nil
}

// benchReport writes report.html and report.md of a finished run.
func benchReport(fs *pflag.FlagSet) runFunc {

	return func(ctx context.Context, args []string) error {
		if len(args) != 1 {
			return fmt.Errorf("%w: vmgated bench report DIR", errUsage)
		}
		dir := args[0]
		results, err := agentbench.ReadResults(dir)
		if err != nil {
			return err
		}
		if len(results) == 0 {
			return fmt.Errorf("%s: no trials in results.jsonl", dir)
		}
		s := agentbench.Summarize(results)
		if err := agentbench.WriteReport(dir, s, results); err != nil {
			return err
		}
		agentbench.WriteMarkdown(os.Stdout, s, nil)
		fmt.Printf("\nReport: %s and %s\n", filepath.Join(dir, "report.html"), filepath.Join(dir, "report.md"))
		return nil
	}
}
