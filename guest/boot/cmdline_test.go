package boot

import (
	"reflect"
	"testing"
)

func TestParseCmdline(t *testing.T) {
	defaults := func(c Cmdline) Cmdline {
		if c.Root == "" {
			c.Root = DefaultRoot
		}
		if c.RootFSType == "" {
			c.RootFSType = DefaultRootFSType
		}
		if c.Init == "" {
			c.Init = DefaultInit
		}
		return c
	}
	tests := []struct {
		name string
		in   string
		want Cmdline
	}{
		{"empty", "", Cmdline{Params: map[string]string{}}},
		{"blank with newline", "  \t\n", Cmdline{Params: map[string]string{}}},
		{
			"typical microvm line",
			"console=ttyS0 reboot=t panic=-1 root=/dev/vda rootfstype=ext4 rw quiet\n",
			Cmdline{
				Params: map[string]string{"console": "ttyS0", "reboot": "t", "panic": "-1", "root": "/dev/vda", "rootfstype": "ext4", "rw": "", "quiet": ""},
				Root:   "/dev/vda", RootFSType: "ext4",
			},
		},
		{
			"probe",
			"console=ttyS0 vmgate.probe=1",
			Cmdline{Params: map[string]string{"console": "ttyS0", "vmgate.probe": "1"}, Probe: true},
		},
		{"probe needs 1", "vmgate.probe=0", Cmdline{Params: map[string]string{"vmgate.probe": "0"}}},
		{"probe flag alone", "vmgate.probe", Cmdline{Params: map[string]string{"vmgate.probe": ""}}},
		{
			"everything",
			"root=/dev/vdb rootfstype=xfs rootflags=noatime,discard ro init=/usr/lib/vmgate/agent",
			Cmdline{
				Params:     map[string]string{"root": "/dev/vdb", "rootfstype": "xfs", "rootflags": "noatime,discard", "ro": "", "init": "/usr/lib/vmgate/agent"},
				Root:       "/dev/vdb",
				RootFSType: "xfs",
				RootFlags:  "noatime,discard",
				ReadOnly:   true,
				Init:       "/usr/lib/vmgate/agent", InitSet: true,
			},
		},
		{
			"repeated keys last wins",
			"root=/dev/vda root=/dev/vdc init=/a init=/b",
			Cmdline{Params: map[string]string{"root": "/dev/vdc", "init": "/b"}, Root: "/dev/vdc", Init: "/b", InitSet: true},
		},
		{"ro then rw", "ro rw", Cmdline{Params: map[string]string{"ro": "", "rw": ""}}},
		{"rw then ro", "rw ro", Cmdline{Params: map[string]string{"ro": "", "rw": ""}, ReadOnly: true}},
		{
			"quoted value",
			`rootflags="a b,c" x=1`,
			Cmdline{Params: map[string]string{"rootflags": "a b,c", "x": "1"}, RootFlags: "a b,c"},
		},
		{
			"quoted whole parameter",
			`"init=/bin/my init" quiet`,
			Cmdline{Params: map[string]string{"init": "/bin/my init", "quiet": ""}, Init: "/bin/my init", InitSet: true},
		},
		{"unterminated quote", `a="b c`, Cmdline{Params: map[string]string{"a": "b c"}}},
		{"empty quoted value", `rootflags="" root=""`, Cmdline{Params: map[string]string{"rootflags": "", "root": ""}}},
		{"value with equals", "a=b=c", Cmdline{Params: map[string]string{"a": "b=c"}}},
		{"empty key ignored", "=x \"\" ok", Cmdline{Params: map[string]string{"ok": ""}}},
		{
			"init args after --",
			"root=/dev/vdb -- init=/evil ro single",
			Cmdline{Params: map[string]string{"root": "/dev/vdb"}, Root: "/dev/vdb"},
		},
		{"tabs and runs of spaces", "a=1\t\tb=2   c", Cmdline{Params: map[string]string{"a": "1", "b": "2", "c": ""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ParseCmdline(tt.in)
			got.Args = nil // checked by TestParseCmdlineArgs
			if want := defaults(tt.want); !reflect.DeepEqual(got, want) {
				t.Fatalf("ParseCmdline(%q)\n got %+v\nwant %+v", tt.in, got, want)
			}
		})
	}
}

func TestParseCmdlineArgs(t *testing.T) {
	got := ParseCmdline(`a=1 "b=x y"  c -- d`).Args
	if want := []string{"a=1", "b=x y", "c"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Args = %q, want %q", got, want)
	}
}

func TestModuleParams(t *testing.T) {
	c := ParseCmdline(`console=ttyS0 virtio_mmio.device=512@0xfeb00e00:12 virtio-mmio.device=512@0xfeb00c00:11 ` +
		`vmgate.probe=1 "ext4.x=a b" ext4.flag ext4. .y=1 ext4x.z=2 ext4=3 ext4.w=p.q=r -- ext4.after=1`)
	tests := []struct{ module, want string }{
		{"virtio_mmio", "device=512@0xfeb00e00:12 device=512@0xfeb00c00:11"},
		{"virtio-mmio", "device=512@0xfeb00e00:12 device=512@0xfeb00c00:11"},
		{"ext4", `x="a b" flag w=p.q=r`},
		{"vmgate", "probe=1"},
		{"console", ""},
		{"jbd2", ""},
		{"", ""},
	}
	for _, tt := range tests {
		if got := c.ModuleParams(tt.module); got != tt.want {
			t.Errorf("ModuleParams(%q) = %q, want %q", tt.module, got, tt.want)
		}
	}
}

func FuzzParseCmdline(f *testing.F) {
	f.Add(`console=ttyS0 root=/dev/vda "rootflags=a b" ro -- x`)
	f.Add(`a="`)
	f.Fuzz(func(t *testing.T, s string) {
		c := ParseCmdline(s)
		if c.Root == "" || c.RootFSType == "" || c.Init == "" || c.Params == nil {
			t.Fatalf("defaults not applied: %+v", c)
		}
	})
}
