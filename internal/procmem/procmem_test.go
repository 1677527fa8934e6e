package procmem

import (
	"os"
	"testing"
)

func TestParse(t *testing.T) {
	text := "55d0c0000000-7ffd5a1ff000 ---p 00000000 00:00 0    [rollup]\nRss:              204800 kB\nPss:              102400 kB\nPss_Anon:          1024 kB\nbogus\nSwap: x kB\n"
	if rss, pss := Parse(text); rss != 200 || pss != 100 {
		t.Errorf("Parse: rss %v pss %v, want 200 and 100", rss, pss)
	}
	if rss, pss := Parse(""); rss != 0 || pss != 0 {
		t.Errorf("Parse of nothing: %v %v", rss, pss)
	}
}

func TestRollupSelf(t *testing.T) {
	rss, pss, ok := Rollup(os.Getpid())
	if !ok || rss <= 0 || pss <= 0 || pss > rss {
		t.Errorf("Rollup of this process: rss %v pss %v ok %v", rss, pss, ok)
	}
	if _, _, ok := Rollup(-1); ok {
		t.Error("Rollup of no process: ok")
	}
}
