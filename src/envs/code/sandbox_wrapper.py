"""Sandbox wrapper: sets up isolation, then runs one untrusted Python program and reports on fd 3.

Started by src/envs/code/sandbox.ts as `python3 -I -S sandbox_wrapper.py CONFIG_JSON`, usually
inside `unshare --net --pid --fork --kill-child --mount --ipc --uts` (so this process is pid 1 of a
fresh pid namespace: when it exits, the kernel kills every process the program left behind).

Standard library only (no site, no venv): it must run under any python3 on the machine.

Config (JSON): workdir, python, timeout_s, memory_mb, file_mb, disk_mb, nproc, uid (int or null),
isolate_fs (bool), userns (bool), memory_mode ("cgroup" | "accounting"), cgroup_dir (str or null).
Report (one JSON line on fd 3): {"exit": int|null, "signal": int|null, "cpu_s": float,
"maxrss_kb": int, "memory_mode": str, "memory_exceeded": bool, "peak_kb": int} or
{"setup_error": "..."} when the sandbox could not be built (an infrastructure failure, never the
program's fault).

The memory limit covers the program and all its children together (src/envs/code/memory.ts): in
"cgroup" mode this process joins the run's memory cgroup before it forks the program, so the
kernel charges and limits them all; in "accounting" mode it sums their Pss every 10 ms and kills
them all past the limit.
"""

import ctypes
import json
import os
import resource
import signal
import sys
import time

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_NO_NEW_PRIVS = 38
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 1
SYS_MOUNT_SETATTR = 442  # the same number on x86_64 and aarch64 (unified syscall table)

libc = ctypes.CDLL(None, use_errno=True)


def report(obj: dict) -> None:
    try:
        os.write(3, (json.dumps(obj) + "\n").encode())
    except OSError:
        pass


def check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _bytes(s: str | None) -> bytes | None:
    return s.encode() if s is not None else None


def mount(
    src: str | None,
    target: str,
    fstype: str | None,
    flags: int,
    data: str | None = None,
) -> None:
    ret = libc.mount(
        _bytes(src), _bytes(target), _bytes(fstype), ctypes.c_ulong(flags), _bytes(data)
    )
    check(ret, f"mount {target}")


class MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def make_everything_read_only() -> None:
    """Every mount this namespace sees becomes read-only (the host's view is unchanged)."""
    attr = MountAttr(MOUNT_ATTR_RDONLY, 0, 0, 0)
    libc.syscall.restype = ctypes.c_long
    ret = libc.syscall(
        ctypes.c_long(SYS_MOUNT_SETATTR),
        ctypes.c_int(AT_FDCWD),
        b"/",
        ctypes.c_uint(AT_RECURSIVE),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    if ret == 0:
        return
    # Kernels before 5.12: remount each mount point read-only, keeping its other flags.
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for mp in sorted(set(points), key=len):
        try:
            st = os.statvfs(mp)
        except OSError:
            continue
        keep = st.f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
        try:
            mount(None, mp, None, MS_BIND | MS_REMOUNT | MS_RDONLY | keep)
        except OSError:
            if mp == "/":
                raise


def count_processes_of_current_user() -> int:
    """Processes of our real uid as /proc shows them (RLIMIT_NPROC counts them too)."""
    uid = os.getuid()
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        n += int(line.split()[1]) == uid
                        break
        except OSError:
            pass
    return n


# Where host processes leave unix sockets (connect() needs no writable filesystem, and a network
# namespace does not cover them) and shared scratch files: replaced by empty read-only tmpfs.
HIDDEN_DIRS = ["/tmp", "/var/tmp", "/run", "/dev/shm"]


def hide_shared_dirs(workdir: str) -> None:
    for d in HIDDEN_DIRS:
        if os.path.islink(d) or not os.path.isdir(d):
            continue
        mount(
            "tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=0755"
        )
        if workdir.startswith(d + "/"):
            os.makedirs(
                workdir, exist_ok=True
            )  # the mount point of the work dir's own tmpfs
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
        mount(None, d, None, flags)


def setup(cfg: dict) -> bytes:
    """Builds the sandbox around cfg['workdir']; returns the program's source."""
    workdir = cfg["workdir"]
    with open(os.path.join(workdir, "main.py"), "rb") as f:
        code = f.read()
    if cfg["isolate_fs"]:
        # Private propagation: nothing we mount here leaks back to the host.
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        make_everything_read_only()
        hide_shared_dirs(workdir)
        # The only writable place: a size-capped tmpfs over the work dir, private to this namespace,
        # so files the program writes vanish with it and never reach the host's disk.
        owner = cfg["uid"] if cfg["uid"] is not None else 0
        opts = f"size={cfg['disk_mb']}m,mode=0700,uid={owner},gid={owner}"
        mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, opts)
        # A fresh /proc for the new pid namespace: the program sees only its own processes.
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        with open(os.path.join(workdir, "main.py"), "wb") as f:
            f.write(code)
        os.chmod(os.path.join(workdir, "main.py"), 0o644)
    return code


def child(cfg: dict) -> None:
    """Runs in the forked child: drop everything, then exec the program. Never returns."""
    try:
        os.closerange(4, 65536)
        # The report pipe closes at exec; setup errors before it still reach it.
        os.set_inheritable(3, False)
        cpu = max(1, int(cfg["timeout_s"] + 0.999))
        mem = cfg["memory_mb"] * 1024 * 1024
        fsize = cfg["file_mb"] * 1024 * 1024
        nproc = cfg["nproc"]
        if cfg["uid"] is None and cfg["userns"]:
            # In a user namespace the limit counts every process of our real uid on the host.
            nproc += cfg["nproc_base"]
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        if nproc > 0:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        if cfg["uid"] is not None:
            uid = cfg["uid"]
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        os.chdir(cfg["workdir"])
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": cfg["workdir"],
            "TMPDIR": cfg["workdir"],
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
        }
        py = cfg["python"]
        os.execve(py, [py, "-I", "-S", "-B", "main.py"], env)
    except BaseException as e:  # noqa: BLE001 - anything here is a setup failure
        report({"setup_error": f"cannot start the program: {type(e).__name__}: {e}"})
        os._exit(126)


ACCOUNTING_INTERVAL_S = 0.01


def join_cgroup(cgroup_dir: str) -> bool:
    """Move this process into the run's cgroup (before the mounts go read-only and before the fork:
    everything forked from here on is charged to it). False if the kernel refuses."""
    try:
        with open(os.path.join(cgroup_dir, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        return True
    except OSError:
        return False


def run_pids(program: int, own_pid_namespace: bool) -> list[int]:
    """The program's processes: everything but us in our own pid namespace, else its descendants."""
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    if own_pid_namespace:
        return [p for p in pids if p != os.getpid()]
    parent: dict[int, int] = {}
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                parent[p] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            pass
    found, frontier = {program}, [program]
    while frontier:
        frontier = [c for c, pp in parent.items() if pp in frontier and c not in found]
        found.update(frontier)
    return sorted(found)


def pss_kb(pid: int) -> int:
    """Proportional set size (shared pages split among their users), else the resident set."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        return 0


def wait_accounting(pid: int, cfg: dict) -> tuple[int, resource.struct_rusage, bool, int]:
    """Wait for the program, killing all its processes once their memory together passes the limit.
    Returns (status, usage, exceeded, peak kB)."""
    limit_kb = cfg["memory_mb"] * 1024
    peak, exceeded = 0, False
    while True:
        try:
            done, status, usage = os.wait4(pid, os.WNOHANG)
        except InterruptedError:
            continue
        if done:
            return status, usage, exceeded, peak
        pids = run_pids(pid, cfg["isolate_fs"])
        total = sum(pss_kb(p) for p in pids)
        peak = max(peak, total)
        if total > limit_kb and not exceeded:
            exceeded = True
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
        time.sleep(ACCOUNTING_INTERVAL_S)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if cfg.get("memory_mode") == "cgroup" and not join_cgroup(cfg["cgroup_dir"]):
        cfg["memory_mode"] = "accounting"
    try:
        cfg["nproc_base"] = count_processes_of_current_user() if cfg["userns"] else 0
        setup(cfg)
    except BaseException as e:  # noqa: BLE001
        report({"setup_error": f"{type(e).__name__}: {e}"})
        os._exit(125)
    pid = os.fork()
    if pid == 0:
        child(cfg)
    # Backstop for the caller's wall-clock kill (e.g. the caller itself died): kill the program a
    # little after its time is up; exiting then takes the rest of the pid namespace with it.
    signal.signal(signal.SIGALRM, lambda *_: os.kill(pid, signal.SIGKILL))
    signal.alarm(int(cfg["timeout_s"] + 0.999) + 2)
    exceeded, peak = False, 0
    if cfg["memory_mode"] == "accounting":
        status, usage, exceeded, peak = wait_accounting(pid, cfg)
    else:
        while True:
            try:
                _, status, usage = os.wait4(pid, 0)
                break
            except InterruptedError:
                continue
    report(
        {
            "exit": os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "maxrss_kb": usage.ru_maxrss,
            "memory_mode": cfg["memory_mode"],
            "memory_exceeded": exceeded,
            "peak_kb": peak,
        }
    )
    # Exiting as pid 1 of the namespace kills whatever the program left running (fork bombs).
    os._exit(0)


if __name__ == "__main__":
    main()
