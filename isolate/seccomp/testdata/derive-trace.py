#!/usr/bin/env python3
# Trace QEMU syscalls for vmgate's configuration. Usage: derive.py OUTDIR
import os, socket, subprocess, sys, time, json, array
IMG = "/var/lib/vmgate/image"
out = sys.argv[1]; os.makedirs(out, exist_ok=True)
tsc = int(float([l.split(":")[1] for l in open("/proc/cpuinfo") if l.startswith("cpu MHz")][0]) * 1000)

def base(d, extra_machine="", net=False):
    a = ["qemu-system-x86_64", "-nodefaults", "-no-user-config", "-nographic",
         "-machine", "microvm,accel=tcg,rtc=on" + extra_machine, "-cpu", "max", "-m", "512", "-smp", "1",
         "-kernel", IMG + "/vmlinuz", "-initrd", IMG + "/initrd.img",
         "-append", "console=ttyS0 reboot=t panic=-1 quiet loglevel=4 root=/dev/vda rw rootfstype=ext4 tsc_early_khz=%d" % tsc,
         "-no-reboot", "-serial", "file:%s/console.log" % d,
         "-object", "rng-random,id=rng0,filename=/dev/urandom", "-device", "virtio-rng-device,rng=rng0",
         "-drive", "id=root,file=%s/overlay.qcow2,format=qcow2,if=none,discard=unmap" % d,
         "-device", "virtio-blk-device,drive=root",
         "-chardev", "socket,id=agent,path=%s/agent.sock,server=on,wait=off" % d,
         "-device", "virtio-serial-device,max_ports=2", "-device", "virtserialport,chardev=agent,name=vmgate.agent",
         "-qmp", "unix:%s/qmp.sock,server=on,wait=off" % d,
         "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"]
    if net:
        a += ["-netdev", "stream,id=n0,server=off,addr.type=unix,addr.path=%s/net.sock" % d,
              "-device", "virtio-net-device,netdev=n0"]
    return a

def wait_path(p, t=30):
    end = time.time() + t
    while not os.path.exists(p):
        if time.time() > end: raise SystemExit("timeout waiting for " + p)
        time.sleep(0.1)

class QMP:
    def __init__(self, path):
        wait_path(path)
        self.s = socket.socket(socket.AF_UNIX); self.s.connect(path); self.f = self.s.makefile("rb")
        self.readmsg()
    def readmsg(self):
        return json.loads(self.f.readline())
    def cmd(self, c, fds=None, **args):
        m = {"execute": c}
        if args: m["arguments"] = args
        data = json.dumps(m).encode() + b"\n"
        if fds: socket.send_fds(self.s, [data], fds)
        else: self.s.sendall(data)
        while True:
            r = self.readmsg()
            if "return" in r or "error" in r:
                print(c, "->", json.dumps(r)[:200], flush=True); return r

def agent_poke(d):
    try:
        s = socket.socket(socket.AF_UNIX); s.connect(d + "/agent.sock"); s.settimeout(3)
        s.sendall(b"SSH-2.0-vmgate-derive\r\n")
        try: print("agent:", s.recv(200)[:60], flush=True)
        except Exception as e: print("agent recv:", e, flush=True)
        s.close()
    except Exception as e: print("agent:", e, flush=True)

def netserver(d):
    s = socket.socket(socket.AF_UNIX); s.bind(d + "/net.sock"); s.listen(1); return s

def strace(name, argv, **kw):
    return subprocess.Popen(["strace", "-f", "-qq", "-s", "32", "-o", "%s/%s.trace" % (out, name)] + argv, **kw)

def mkoverlay(d):
    os.makedirs(d, exist_ok=True)
    subprocess.check_call(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", IMG + "/base.qcow2", d + "/overlay.qcow2"])

which = sys.argv[2] if len(sys.argv) > 2 else "ABC"
# Run A: cold boot, the brief's argv.
if "A" in which:
    d = out + "/A"; mkoverlay(d)
    p = strace("A", base(d))
    q = QMP(d + "/qmp.sock"); q.cmd("qmp_capabilities"); q.cmd("query-status")
    time.sleep(60); agent_poke(d)
    q.cmd("stop"); time.sleep(1); q.cmd("cont"); time.sleep(2); agent_poke(d)
    q.cmd("query-status"); q.cmd("quit"); print("A rc", p.wait(), flush=True)
# Run B: template with file-backed shared RAM, NIC over -netdev stream, outgoing migration to an fd.
if "B" in which:
    d = out + "/B"; mkoverlay(d); ns = netserver(d)
    argv = base(d, ",memory-backend=mem", net=True) + ["-object", "memory-backend-file,id=mem,size=512M,mem-path=%s/ram,share=on" % d]
    p = strace("B", argv)
    q = QMP(d + "/qmp.sock"); q.cmd("qmp_capabilities")
    ns.settimeout(20); c, _ = ns.accept(); c.settimeout(0.2)
    time.sleep(45); agent_poke(d)
    try: print("net got", len(c.recv(65536)), flush=True)
    except Exception as e: print("net:", e, flush=True)
    q.cmd("stop")
    q.cmd("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
    mf = os.open(d + "/state.mig", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    q.cmd("getfd", fds=[mf], fdname="mig"); os.close(mf)
    q.cmd("migrate", uri="fd:mig")
    for _ in range(100):
        r = q.cmd("query-migrate")
        if r["return"].get("status") in ("completed", "failed"): break
        time.sleep(0.2)
    q.cmd("quit"); print("B rc", p.wait(), flush=True)
    c.close()
# Run C: clone: private CoW RAM from B's file, -incoming defer, migrate-incoming fd:3 on an inherited fd.
if "C" in which:
    b = out + "/B"; d = out + "/C"; os.makedirs(d, exist_ok=True)
    subprocess.check_call(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", b + "/overlay.qcow2", d + "/overlay.qcow2"])
    ns = netserver(d)
    sf = os.open(b + "/state.mig", os.O_RDONLY); os.dup2(sf, 7); os.set_inheritable(7, True)
    argv = base(d, ",memory-backend=mem", net=True) + ["-object", "memory-backend-file,id=mem,size=512M,mem-path=%s/ram,share=off" % b, "-incoming", "defer"]
    p = strace("C", argv, pass_fds=(7,))
    q = QMP(d + "/qmp.sock"); q.cmd("qmp_capabilities")
    ns.settimeout(20); c, _ = ns.accept()
    q.cmd("migrate-set-capabilities", capabilities=[{"capability": "x-ignore-shared", "state": True}])
    q.cmd("migrate-incoming", uri="fd:7")
    for _ in range(100):
        r = q.cmd("query-status")
        if r["return"].get("status") != "inmigrate": break
        time.sleep(0.1)
    q.cmd("cont"); time.sleep(10); agent_poke(d); time.sleep(2)
    q.cmd("quit"); print("C rc", p.wait(), flush=True)
