"""The sandbox's own side: isolates, limits and starts one untrusted Python program.

Run by `pipeline.rewards.sandbox` as `python -I -S sandbox_child.py VERDICT_FD STATUS_FD`, as any
user, with the request on stdin (`marshal`: built in, where `json` costs an import of `re` per run;
the request comes from the host, not from the data); it imports nothing from the project. Steps:

1. A user namespace, and with it new mount, network, PID, IPC and UTS namespaces, in one
   `unshare(2)` (through ctypes: Python 3.11 has no `os.unshare`). Inside it the launcher holds
   every capability over those namespaces and none over the host, so no root is needed (issue 20).
   The uid maps: as root of the host, inner 0 (the set-up) and inner 1000 (the program) are two
   uids of the run's own, `uid_base + 2 x pid of this launcher` and the next: unique while this
   process lives, and every process of the run is gone before it exits (PID 1 of the namespace
   outlives them all), so no two runs ever share one, whatever the host's `random` was seeded
   with. Only a process outside may write such a map: a helper forked before the `unshare`
   writes it. As any other user the kernel maps just the user's own uid, as inner 0, and the
   program runs as that inner 0 without any capability (SECBIT_NOROOT, step 4). Refused by the
   kernel (user namespaces disabled, a namespace limit, a seccomp policy): the program does not
   run and STATUS_FD says `refused`.
2. No namespace nests in it (`user.max_user_namespaces` 0 in the new user namespace): a nested one
   would give the program a mount namespace of its own, and a tmpfs there that no limit counts.
3. A new root, built on an empty tmpfs and entered with `pivot_root(2)`; the host's tree is
   detached. It holds what the interpreter needs, read-only: its prefix, the system library
   folders (/usr/lib*, /lib*), /etc/ld.so.cache, and /dev's null, zero, full, random and urandom;
   /tmp is the scratch (the program, its inputs, and `work/`, the only place it may write). No
   /proc, /sys, /run, workspace or project folder: no file, unix socket or FIFO of the host is
   there to read or to reach.
4. A fork: the child is PID 1 of the new PID namespace. It forks the program, which keeps only
   descriptors 0 (its `stdin` bytes, then EOF), 1 and 2 (the output pipe) and 3 (VERDICT_FD),
   sets its resource limits, takes the program's uid (no groups where the kernel lets us drop
   them, no capabilities, no new privileges), installs a seccomp filter (`DENIED`: the memory
   no resource limit counts, the verdict channel of another process, kernel keyrings) and execs
   `python -I -S -B /tmp/program.py /tmp/input` in /tmp/work, with HOME and TMPDIR (/tmp/work)
   as its whole environment.
5. PID 1 reaps until the program exits, writes `exit N` or `signal N` to STATUS_FD and exits, which
   kills whatever the program left behind. On the host's timeout (SIGTERM) this process kills PID
   1, and with it the namespace, and reaps it; killed outright (SIGKILL, the host's last resort),
   it takes PID 1 along through its parent-death signal.

STATUS_FD is never open in the program, so only this file writes it.
"""

import ctypes
import fcntl
import marshal
import os
import resource
import signal
import struct
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACES = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_RELATIME = 0x200000
MS_STRICTATIME = 0x1000000
MNT_DETACH = 0x2
# Per-mount options as /proc/self/mountinfo spells them; a read-only remount must restate them
# (in a user namespace the kernel refuses to clear the ones the host set).
MOUNT_OPTIONS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}

PR_SET_PDEATHSIG = 1
PR_SET_SECCOMP = 22
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
SECBIT_NOROOT = 0x1 | 0x2  # and locked: uid 0 gains no capability at exec
SECCOMP_MODE_FILTER = 2

SETUP_UID = 0  # inner uid of this launcher and of PID 1
PROGRAM_UID = 1000  # inner uid of the program where the host's root maps a second uid
VERDICT_FD = 3  # where the program finds its result channel
ROOT = "/tmp"  # the host directory the new root's tmpfs is mounted on (it exists everywhere)
ROOT_BYTES = 1024 * 1024  # the new root holds only directories, mount points and links
SCRATCH = "/tmp"
WORK = f"{SCRATCH}/work"  # cwd, HOME and TMPDIR: the one directory the program may write
# What the interpreter and the standard library's extension modules load, and nothing more.
LIBRARIES = ("/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32", "/lib", "/lib32", "/lib64", "/libx32")
LINKER_CACHE = "/etc/ld.so.cache"  # where the loader finds libraries outside its default path
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
OPEN_FILES = 256  # RLIMIT_NOFILE: Python needs a few dozen

# Per architecture: the audit arch, pivot_root's number, and the system calls refused (EPERM).
# Refused: memfd_create and memfd_secret and SysV shared memory, message queues and semaphores
# (memory that RLIMIT_AS never sees once unmapped: issue 20 held 3 GiB through each); ptrace,
# process_vm_readv/writev and pidfd_getfd (a process the verifier starts would reach the
# harness's verdict channel through them); the kernel keyrings (a key outlives its sandbox);
# io_uring (memory of its own, and not needed).
SYSCALLS = {
    "x86_64": (
        0xC000003E,
        155,
        {
            "memfd_create": 319,
            "memfd_secret": 447,
            "shmget": 29,
            "msgget": 68,
            "semget": 64,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "pidfd_getfd": 438,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
        },
    ),
    "aarch64": (
        0xC00000B7,
        41,
        {
            "memfd_create": 279,
            "memfd_secret": 447,
            "shmget": 194,
            "msgget": 186,
            "semget": 190,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "pidfd_getfd": 438,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
        },
    ),
}
X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 ABI: the same calls under other numbers, all refused

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.unshare.argtypes = [ctypes.c_int]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
libc.syscall.restype = ctypes.c_long


class SetupError(Exception):
    """The sandbox could not be built; `kind` is `refused` (namespaces) or `setup`."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _check(result: int, what: str, kind: str = "setup") -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise SetupError(kind, f"{what}: {os.strerror(errno)} (errno {errno})")


def _c_string(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    result = libc.mount(_c_string(source), _c_string(target), _c_string(fstype), flags, _c_string(data))
    _check(result, f"mount {target}")


def _prctl(option: int, value: int) -> None:
    _check(libc.prctl(option, value, 0, 0, 0), f"prctl({option})")


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _architecture() -> tuple[int, int, dict[str, int]]:
    machine = os.uname().machine
    if machine not in SYSCALLS:
        raise SetupError("setup", f"no system-call table for {machine} (known: {', '.join(SYSCALLS)})")
    return SYSCALLS[machine]


# 1. Namespaces and identity


def _host_root() -> bool:
    """Root of the host's own user namespace: free to map uids of its choice."""
    if os.geteuid() != 0:
        return False
    with open("/proc/self/uid_map") as uid_map:
        return uid_map.read().split() == ["0", "0", "4294967295"]


def _enter_as_host_root(uid_base: int) -> None:
    """Unshare, with a helper outside writing the maps: inner 0 and 1000 -> the run's two uids."""
    first = uid_base + 2 * os.getpid()
    mapping = f"{SETUP_UID} {first} 1\n{PROGRAM_UID} {first + 1} 1\n"
    os.setgroups([])  # the host's supplementary groups would otherwise stay with every process
    ready_r, ready_w = os.pipe()
    helper = os.fork()
    if helper == 0:
        code = 1
        try:
            os.close(ready_w)
            if os.read(ready_r, 1) == b"u":
                for name in ("uid_map", "gid_map"):
                    _write(f"/proc/{os.getppid()}/{name}", mapping)
                code = 0
        finally:
            os._exit(code)
    os.close(ready_r)
    try:
        _check(libc.unshare(NAMESPACES), "unshare(user, mount, network, pid, ipc, uts namespaces)", kind="refused")
        os.write(ready_w, b"u")
    finally:
        os.close(ready_w)
        _, status = os.waitpid(helper, 0)
    if status != 0:
        raise SetupError("setup", "the helper could not write the user namespace's uid and gid maps")


def _enter_as_user() -> None:
    """Unshare and map the user's own uid and gid as inner 0 (all an unprivileged user may map)."""
    uid, gid = os.geteuid(), os.getegid()
    _check(libc.unshare(NAMESPACES), "unshare(user, mount, network, pid, ipc, uts namespaces)", kind="refused")
    try:
        _write("/proc/self/setgroups", "deny")  # the kernel's condition for an unprivileged gid map
        _write("/proc/self/uid_map", f"{SETUP_UID} {uid} 1\n")
        _write("/proc/self/gid_map", f"{SETUP_UID} {gid} 1\n")
    except OSError as error:  # e.g. Ubuntu's AppArmor leaves such a namespace without capabilities
        raise SetupError("refused", f"mapping the user's uid in its user namespace: {error}") from error


# 3. The new root


def _unescape(field: str) -> str:
    """A mountinfo path with its octal escapes (\\040 for a space) undone. By hand: a codec would
    be imported from the standard library, which this uid may no longer read (a prefix in /root)."""
    raw, out, index = field.encode(), bytearray(), 0
    while index < len(raw):
        digits = raw[index + 1 : index + 4]
        if raw[index] == 0x5C and len(digits) == 3 and digits.isdigit():
            out.append(int(digits, 8))
            index += 4
        else:
            out.append(raw[index])
            index += 1
    return out.decode()


def _mount_points() -> list[tuple[str, int]]:
    """(mount point, per-mount flags) of every mount in this namespace, from /proc/self/mountinfo."""
    points = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            fields = line.split()
            point = _unescape(fields[4])
            flags = 0
            for option in fields[5].split(","):
                flags |= MOUNT_OPTIONS.get(option, 0)
            points.append((point, flags))
    return points


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _sources(prefix: str) -> tuple[list[str], list[str], list[str]]:
    """(folders to bind read-only, links to copy, files to bind) from the host, by path."""
    links = [path for path in LIBRARIES if os.path.islink(path)]  # merged /usr: /lib -> usr/lib
    candidates = [path for path in LIBRARIES if path not in links and os.path.isdir(path)] + [prefix]
    # A folder inside another (the prefix /usr holds /usr/lib) comes with it.
    folders = [path for path in candidates if not any(_under(path, other) and path != other for other in candidates)]
    files = [path for path in (LINKER_CACHE, *DEVICES) if os.path.exists(path)]
    return folders, links, files


def _open_sources(paths: list[str]) -> dict[str, int]:
    """O_PATH descriptors of what gets bound, opened while this process still has the host
    identity that may reach them (a prefix under /root, 0700: the run's own uid may not)."""
    return {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in paths}


def _bind(path: str, descriptor: int, folder: bool) -> str:
    target = ROOT + path
    if folder:
        os.makedirs(target, 0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    _mount(f"/proc/self/fd/{descriptor}", target, None, MS_BIND | MS_REC)
    os.close(descriptor)
    return target


def _fill_scratch(request: dict, program_uid: int) -> None:
    scratch = ROOT + SCRATCH
    os.makedirs(scratch, 0o755, exist_ok=True)
    _mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, f"size={request['scratch_bytes']},mode=0755")
    os.mkdir(f"{scratch}/input", 0o755)
    for name, content in request["inputs"].items():
        with open(f"{scratch}/input/{name}", "wb") as handle:
            handle.write(content)
    with open(f"{scratch}/program.py", "w", encoding="utf-8") as handle:
        handle.write(request["program"])
    os.mkdir(ROOT + WORK, 0o700)
    os.chown(ROOT + WORK, program_uid, program_uid)


def _build_root(request: dict, program_uid: int, sources: dict[str, int], folders, links, files) -> None:
    """The new root on a tmpfs, read-only but for the scratch; then pivot into it."""
    _mount("tmpfs", ROOT, "tmpfs", MS_NOSUID | MS_NODEV, f"size={ROOT_BYTES},mode=0755")
    read_only = [_bind(path, sources[path], folder=True) for path in folders]
    for path in links:
        os.symlink(os.readlink(path), ROOT + path)
    for path in files:
        target = _bind(path, sources[path], folder=False)
        if not path.startswith("/dev/"):  # a device node keeps the host's mount: `nodev` would break it
            read_only.append(target)
    _fill_scratch(request, program_uid)
    for point, flags in _mount_points():
        if any(_under(point, target) for target in read_only):
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | flags)
    _, pivot_root, _ = _architecture()
    os.chdir(ROOT)
    # pivot_root(".", "."): the old root ends up stacked on the new one, and is then detached.
    _check(libc.syscall(ctypes.c_long(pivot_root), b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "detach the host's root")
    os.chdir("/")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


# 4. The program


def _seccomp_filter() -> bytes:
    """A classic BPF program: another architecture is killed, a refused call returns EPERM."""
    arch, _, calls = _architecture()
    denied = sorted(calls.values())
    instructions = [
        (0x20, 0, 0, 4),  # load seccomp_data.arch
        (0x15, 1, 0, arch),  # the expected one: skip the kill
        (0x06, 0, 0, 0x80000000),  # SECCOMP_RET_KILL_PROCESS
        (0x20, 0, 0, 0),  # load seccomp_data.nr
        (0x35, len(denied) + 1, 0, X32_SYSCALL_BIT),  # x32 numbers: to EPERM
    ]
    instructions += [(0x15, len(denied) - index, 0, number) for index, number in enumerate(denied)]
    instructions += [(0x06, 0, 0, 0x7FFF0000), (0x06, 0, 0, 0x00050000 | 1)]  # ALLOW; ERRNO(EPERM)
    return b"".join(struct.pack("HBBI", *instruction) for instruction in instructions)


def _install_seccomp() -> None:
    program = ctypes.create_string_buffer(_seccomp_filter())
    fprog = ctypes.create_string_buffer(struct.pack("HxxxxxxQ", len(program.raw) // 8, ctypes.addressof(program)))
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "seccomp filter")


def _arrange_descriptors(stdin: bytes, verdict_fd: int, status: int) -> None:
    """0: the job's stdin bytes then EOF; 1 and 2: the output pipe; 3: the verdict pipe; nothing
    else but `status` (close-on-exec): issue 20, a duplicate of the verdict pipe left open let the
    prediction write a verdict."""
    stdin_r, stdin_w = os.pipe()
    os.write(stdin_w, stdin)  # at most 4 KiB (the host checks): it fits the pipe
    os.close(stdin_w)
    os.dup2(stdin_r, 0)
    os.dup2(verdict_fd, VERDICT_FD)
    os.closerange(VERDICT_FD + 1, status)
    os.closerange(status + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1])


def _exec_program(request: dict, program_uid: int, verdict_fd: int, status: int) -> None:
    """In the program's process: descriptors, limits, an unprivileged identity, then exec. Never
    returns."""
    _arrange_descriptors(request["stdin"], verdict_fd, status)
    # Where the program shares the set-up's uid, this launcher and PID 1 count among its processes.
    shared_uid = 2 if program_uid == SETUP_UID else 0
    limits = {
        resource.RLIMIT_AS: request["memory_bytes"],
        resource.RLIMIT_CPU: (request["cpu_time_s"], request["cpu_time_s"] + 1),
        resource.RLIMIT_NPROC: request["max_processes"] + shared_uid,
        resource.RLIMIT_FSIZE: request["scratch_bytes"],
        resource.RLIMIT_NOFILE: OPEN_FILES,
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_MSGQUEUE: 0,  # POSIX message queues: no memory of their own either
        resource.RLIMIT_MEMLOCK: 0,
    }
    for kind, limit in limits.items():
        resource.setrlimit(kind, limit if isinstance(limit, tuple) else (limit, limit))
    if program_uid != SETUP_UID:
        os.setgroups([])
    _prctl(PR_SET_SECUREBITS, SECBIT_NOROOT)
    os.setresgid(program_uid, program_uid, program_uid)
    os.setresuid(program_uid, program_uid, program_uid)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    _install_seccomp()
    os.chdir(WORK)
    os.execve(
        request["executable"],
        [request["executable"], "-I", "-S", "-B", f"{SCRATCH}/program.py", f"{SCRATCH}/input"],
        {"HOME": WORK, "TMPDIR": WORK},
    )


def _namespace_init(request: dict, program_uid: int, verdict_fd: int, status_fd: int) -> int:
    """PID 1 of the new namespace: start the program, reap, report how it ended."""
    # If the launcher was killed before this was armed, the host's kill of the process group
    # reached this process too (a parent outside the namespace reads as PID 0: no check here).
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    program = os.fork()
    if program == 0:
        # Above descriptor 3 and closed at exec: the program never holds it.
        status = fcntl.fcntl(status_fd, fcntl.F_DUPFD_CLOEXEC, VERDICT_FD + 1)
        try:
            _exec_program(request, program_uid, verdict_fd, status)
        except BaseException as error:  # noqa: BLE001 - any failure before exec is a setup failure
            os.write(status, f"setup starting the program: {error}\n".encode())
        os._exit(127)
    os.close(verdict_fd)
    while True:  # PID 1 inherits every orphan: reap them all until the program itself ends
        pid, status = os.wait()
        if pid == program:
            break
    if os.WIFSIGNALED(status):
        os.write(status_fd, f"signal {os.WTERMSIG(status)}\n".encode())
    else:
        os.write(status_fd, f"exit {os.WEXITSTATUS(status)}\n".encode())
    return 0


def _build(request: dict) -> int:
    """Steps 1-3; returns the program's inner uid."""
    host_root = _host_root()
    folders, links, files = _sources(request["prefix"])
    if host_root:
        _enter_as_host_root(request["uid_base"])
    else:
        _enter_as_user()
    sources = _open_sources(folders + files)
    if host_root:
        os.setresgid(SETUP_UID, SETUP_UID, SETUP_UID)
        os.setresuid(SETUP_UID, SETUP_UID, SETUP_UID)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a change of uid cleared it
    _write("/proc/sys/user/max_user_namespaces", "0")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates to the host
    program_uid = PROGRAM_UID if host_root else SETUP_UID
    _build_root(request, program_uid, sources, folders, links, files)
    return program_uid


def main() -> int:
    verdict_fd, status_fd = int(sys.argv[1]), int(sys.argv[2])
    os.set_inheritable(verdict_fd, True)
    os.set_inheritable(status_fd, False)
    os.umask(0o022)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the host died: so does the sandbox
    request = marshal.loads(sys.stdin.buffer.read())
    try:
        program_uid = _build(request)
    except (SetupError, OSError) as error:
        kind = error.kind if isinstance(error, SetupError) else "setup"
        os.write(status_fd, f"{kind} {error}\n".encode())
        return 1
    init = os.fork()
    if init == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            code = _namespace_init(request, program_uid, verdict_fd, status_fd)
        except BaseException as error:  # noqa: BLE001 - reported, then PID 1 ends the namespace
            os.write(status_fd, f"setup in the namespace: {error}\n".encode())
            code = 1
        os._exit(code)
    os.close(verdict_fd)
    os.close(status_fd)
    global _init
    _init = init
    os.waitpid(init, 0)
    return 0


_init: int | None = None  # PID 1 of the namespace, once forked


def _stop_on_sigterm(number: int, frame: object) -> None:
    """The host's timeout: kill PID 1, which takes the namespace along, and reap it before exiting,
    so that no process of the run outlives this one (an orphaned PID 1 would wait as a zombie for
    the host's init to reap it). Before PID 1 exists there is nothing to wait for."""
    if _init is None:
        os._exit(1)
    os.kill(_init, signal.SIGKILL)


if __name__ == "__main__":
    # os._exit: the interpreter's own clean-up would cost every verification tens of milliseconds.
    os._exit(main())
