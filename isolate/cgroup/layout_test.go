package cgroup

import (
	"reflect"
	"testing"
)

// mountinfo lines as a Debian 12 host, a hybrid host and a container show them.
const (
	miV2 = `24 31 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
29 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
	miHybrid = `30 24 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
33 30 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
34 30 0:30 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
35 30 0:31 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	miCombined = `31 30 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
33 30 0:29 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
`
	miSpace = `29 24 0:26 / /sys/fs/cgroup\040x rw - cgroup2 cgroup2 rw
`
)

func TestDetect(t *testing.T) {
	cases := []struct {
		name, cg, mi string
		want         Layout
		err          bool
	}{
		{"v2 systemd service", "0::/system.slice/vmgated.service\n", miV2,
			Layout{V2Dir: "/sys/fs/cgroup/system.slice/vmgated.service", V1Dirs: map[string]string{}}, false},
		{"hybrid", "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/8b49\n1:cpu:/\n0::/\n", miHybrid,
			Layout{V2Dir: "/sys/fs/cgroup/unified", V1Dirs: map[string]string{
				"pids": "/sys/fs/cgroup/pids", "memory": "/sys/fs/cgroup/memory/process_api/8b49", "cpu": "/sys/fs/cgroup/cpu"}}, false},
		{"combined controllers, container mount root", "3:cpu,cpuacct:/a\n4:memory:/docker/abc/x\n", miCombined,
			Layout{V1Dirs: map[string]string{"cpu": "/sys/fs/cgroup/cpu,cpuacct/a", "memory": "/sys/fs/cgroup/memory/x"}}, false},
		{"path outside the mount root is not shown", "4:memory:/other\n", miCombined,
			Layout{V1Dirs: map[string]string{}}, false},
		{"escaped mount point", "0::/a\n", miSpace,
			Layout{V2Dir: "/sys/fs/cgroup x/a", V1Dirs: map[string]string{}}, false},
		{"no cgroup fs", "0::/\n", "24 31 0:22 / /sys rw - sysfs sysfs rw\n",
			Layout{V1Dirs: map[string]string{}}, false},
		{"malformed cgroup line", "garbage\n", miV2, Layout{}, true},
		{"relative path", "0::a\n", miV2, Layout{}, true},
		{"malformed mountinfo", "0::/\n", "1 2 3\n", Layout{}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Detect(c.cg, c.mi)
			if (err != nil) != c.err {
				t.Fatalf("err = %v, want error %v", err, c.err)
			}
			if !c.err && !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v\nwant %+v", got, c.want)
			}
		})
	}
}

func FuzzDetect(f *testing.F) {
	f.Add("0::/a\n", miV2)
	f.Add("4:memory:/x\n", miHybrid)
	f.Fuzz(func(t *testing.T, cg, mi string) {
		_, _ = Detect(cg, mi)
	})
}

func TestLimitWrites(t *testing.T) {
	l := Limits{MemoryBytes: 1 << 30, Pids: 256, CPUs: 1.5}
	cases := []struct {
		name string
		v    int
		l    Limits
		want []Write
		err  bool
	}{
		{"v2 all", 2, l, []Write{
			{"memory", "memory.max", "1073741824", false},
			{"memory", "memory.swap.max", "0", true},
			{"pids", "pids.max", "256", false},
			{"cpu", "cpu.max", "150000 100000", false},
		}, false},
		{"v1 all", 1, l, []Write{
			{"memory", "memory.limit_in_bytes", "1073741824", false},
			{"memory", "memory.memsw.limit_in_bytes", "1073741824", true},
			{"pids", "pids.max", "256", false},
			{"cpu", "cpu.cfs_period_us", "100000", false},
			{"cpu", "cpu.cfs_quota_us", "150000", false},
		}, false},
		{"v2 pids only", 2, Limits{Pids: 8}, []Write{{"pids", "pids.max", "8", false}}, false},
		{"nothing", 2, Limits{}, nil, false},
		{"negative cpu", 2, Limits{CPUs: -1}, nil, true},
		{"tiny cpu", 1, Limits{CPUs: 0.001}, nil, true},
		{"bad version", 3, l, nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := LimitWrites(c.v, c.l)
			if (err != nil) != c.err {
				t.Fatalf("err = %v", err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v\nwant %+v", got, c.want)
			}
		})
	}
}

func TestWeightWrite(t *testing.T) {
	for _, c := range []struct {
		v, w int
		want Write
		err  bool
	}{
		{2, 1, Write{"cpu", "cpu.weight", "1", false}, false},
		{2, 100, Write{"cpu", "cpu.weight", "100", false}, false},
		{1, 100, Write{"cpu", "cpu.shares", "1024", false}, false},
		{1, 1, Write{"cpu", "cpu.shares", "10", false}, false},
		{1, 10000, Write{"cpu", "cpu.shares", "102400", false}, false},
		{2, 0, Write{}, true},
		{2, 10001, Write{}, true},
		{3, 100, Write{}, true},
	} {
		got, err := WeightWrite(c.v, c.w)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("v%d weight %d: got %+v %v", c.v, c.w, got, err)
		}
	}
}

func TestGroupName(t *testing.T) {
	a, b := GroupName("/var/lib/vmgate"), GroupName("/var/lib/vmgate/")
	if a != b || len(a) != len("vmgate-")+12 {
		t.Fatalf("%q %q", a, b)
	}
	if GroupName("/tmp/x") == a {
		t.Fatal("different state dirs share a group")
	}
}
