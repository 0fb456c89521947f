"""The seccomp filter of the process that runs candidate code: system calls it never needs.

Why a filter, beside the dedicated identity (`runner`): kernel objects a process creates
are counted per user at every level of its user namespaces, up to the initial one,
against the uid that owns each namespace, so inotify instances made inside the sandbox
were charged to the launching user (root: five sandboxes held all 128 of root's inotify
instances, and every process of root on the host failed to create one). The identity
moves those counts to a uid no one else uses, when the trainer is root; the filter
removes the calls that take such counts (or reach kernel surfaces a pure function never
needs) whoever the trainer is:

* per-user kernel objects: inotify_init/init1/add_watch, fanotify_init/mark, mq_open
  (RLIMIT_MSGQUEUE), add_key/request_key/keyctl (the user's key quota);
* namespaces and mounts: unshare, setns, clone with any CLONE_NEW* flag, clone3 (ENOSYS,
  so the C library falls back to clone, whose flags the filter can read), mount, umount2,
  pivot_root, the new mount API (open_tree, move_mount, fsopen, fsconfig, fsmount, fspick,
  mount_setattr);
* other processes and the kernel: ptrace, process_vm_readv/writev, perf_event_open, bpf,
  userfaultfd, io_uring_setup/enter/register, name_to_handle_at, open_by_handle_at,
  kexec_load/kexec_file_load, init/finit/delete_module, acct, swapon/swapoff, reboot,
  quotactl, syslog, sethostname, setdomainname, vhangup, personality, memfd_secret,
  lookup_dcookie, uselib;
* socket address families no namespace contains: socket and socketpair get EAFNOSUPPORT
  for every family but AF_UNIX, AF_INET and AF_INET6 (`ALLOWED_FAMILIES`).

Each returns EPERM (clone3: ENOSYS; a refused family: EAFNOSUPPORT). A system call of
another ABI than the machine's (x86_64's i386 and x32 entries) kills the process: the
numbers above would not match. Everything else (files in the sandbox's own view, pipes,
fork, threads, the three socket families in the empty network namespace, signals to its
own processes) is allowed.

Sockets. A namespace contains an address family only where the family keeps its state
per namespace, and a red team found one that does not: AF_VSOCK's address space is the
host's, so two concurrent sandboxes could signal each other through it. So the family
(socket's and socketpair's first argument) is checked against an allow-list of what the
harness and ordinary code need, each contained by the sandbox's namespaces:

* AF_UNIX (1): socketpair is how asyncio makes its self-pipe and multiprocessing its
  Pipe; abstract names are per network namespace, and filesystem names are files of the
  sandbox's private mount namespace (a fresh /tmp and read-only system directories; the
  host's /run, /var and /tmp, where daemons put their sockets, are not there);
* AF_INET (2) and AF_INET6 (10): their whole state (interfaces, routes, ports) is per
  network namespace, and the sandbox's is empty, so code that opens one fails to connect
  as on any offline machine.

Every other number, the families the kernel has (AF_NETLINK: kernel subsystems beyond
routing; AF_PACKET, AF_XDP: raw devices; AF_VSOCK; AF_ALG: the kernel's crypto; AF_KEY,
AF_BLUETOOTH, AF_TIPC, AF_RDS, AF_CAN, AF_QIPCRTR, AF_SMC, AF_MCTP ...) and any it does
not have yet, gets EAFNOSUPPORT, what a kernel built without the family returns, so code
that probes for one degrades as it would there (glibc's getaddrinfo, refused a netlink
socket, assumes both IPv4 and IPv6). A refused family is also never created, so the
sandbox cannot make the host load a protocol module (the kernel loads net-pf-N on the
first socket of an absent family): rarely used families have been the way into several
kernel exploits. The filter compares the low 32 bits of the argument: seccomp sees the
64-bit register, but the kernel declares the family an int and truncates the register to
it, so (1 << 32) | 1 is AF_UNIX to both, and a check of the whole register would refuse
what the kernel reads as an allowed family and protect nothing more. No other call makes
a socket of a new family: x86_64's 64-bit ABI has no socketcall (the i386 ABI is killed,
the x32 one refused), io_uring's socket operation goes with io_uring, and accept returns
the listening socket's family.

The program is classic BPF, built here in the parent (`program`) and installed by the
child with prctl(PR_SET_SECCOMP) after no_new_privs. Machines: x86_64, aarch64, riscv64
(the generic system call table); elsewhere `program` is empty and no filter is installed
(`runner.describe` says so).
"""

from __future__ import annotations

import platform
import struct

# Classic BPF opcodes and seccomp's return values (linux/filter.h, linux/seccomp.h).
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
EPERM, ENOSYS, EAFNOSUPPORT = 1, 38, 97
# Offsets in struct seccomp_data: nr, arch, args[0]'s low and high words (little-endian).
_NR, _ARCH, _ARG0, _ARG0_HIGH = 0, 4, 16, 20
X32_BIT = 0x40000000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET.
CLONE_NEW_MASK = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000
CLONE_NEW_MASK |= 0x20000000 | 0x40000000
# The address families socket and socketpair may make (linux/socket.h); why in the docstring.
ALLOWED_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10}

_DENIED = [
  "inotify_init",
  "inotify_init1",
  "inotify_add_watch",
  "fanotify_init",
  "fanotify_mark",
  "mq_open",
  "add_key",
  "request_key",
  "keyctl",
  "unshare",
  "setns",
  "mount",
  "umount2",
  "pivot_root",
  "open_tree",
  "move_mount",
  "fsopen",
  "fsconfig",
  "fsmount",
  "fspick",
  "mount_setattr",
  "ptrace",
  "process_vm_readv",
  "process_vm_writev",
  "perf_event_open",
  "bpf",
  "userfaultfd",
  "io_uring_setup",
  "io_uring_enter",
  "io_uring_register",
  "name_to_handle_at",
  "open_by_handle_at",
  "kexec_load",
  "kexec_file_load",
  "init_module",
  "finit_module",
  "delete_module",
  "acct",
  "swapon",
  "swapoff",
  "reboot",
  "quotactl",
  "syslog",
  "sethostname",
  "setdomainname",
  "vhangup",
  "personality",
  "memfd_secret",
  "lookup_dcookie",
  "uselib",
]

_X86_64 = {
  "clone": 56, "clone3": 435, "socket": 41, "socketpair": 53, "ptrace": 101, "syslog": 103,
  "uselib": 134, "personality": 135, "vhangup": 153, "pivot_root": 155, "acct": 163,
  "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169,
  "sethostname": 170, "setdomainname": 171, "init_module": 175, "delete_module": 176,
  "quotactl": 179, "lookup_dcookie": 212, "mq_open": 240, "kexec_load": 246, "add_key": 248,
  "request_key": 249, "keyctl": 250, "inotify_init": 253, "inotify_add_watch": 254,
  "unshare": 272, "inotify_init1": 294, "perf_event_open": 298, "fanotify_init": 300,
  "fanotify_mark": 301, "name_to_handle_at": 303, "open_by_handle_at": 304, "setns": 308,
  "process_vm_readv": 310, "process_vm_writev": 311, "finit_module": 313,
  "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
  "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
  "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
  "memfd_secret": 447,
}  # fmt: skip
# asm-generic/unistd.h (aarch64, riscv64): no inotify_init, lookup_dcookie 18, no uselib.
# Neither table has socketcall (i386's multiplexer, the only other way to make a socket).
_GENERIC = {
  "lookup_dcookie": 18, "inotify_init1": 26, "inotify_add_watch": 27, "umount2": 39,
  "mount": 40, "pivot_root": 41, "vhangup": 58, "quotactl": 60, "acct": 89, "personality": 92,
  "unshare": 97, "kexec_load": 104, "init_module": 105, "delete_module": 106, "syslog": 116,
  "ptrace": 117, "reboot": 142, "sethostname": 161, "setdomainname": 162, "mq_open": 180,
  "socket": 198, "socketpair": 199, "add_key": 217, "request_key": 218, "keyctl": 219,
  "clone": 220, "swapon": 224, "swapoff": 225, "perf_event_open": 241, "fanotify_init": 262,
  "fanotify_mark": 263, "name_to_handle_at": 264, "open_by_handle_at": 265, "setns": 268,
  "process_vm_readv": 270, "process_vm_writev": 271, "finit_module": 273, "bpf": 280,
  "userfaultfd": 282, "kexec_file_load": 294, "io_uring_setup": 425, "io_uring_enter": 426,
  "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
  "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435, "mount_setattr": 442,
  "memfd_secret": 447,
}  # fmt: skip
# machine -> (AUDIT_ARCH_*, system call numbers, whether the x32 bit must be refused).
MACHINES = {
  "x86_64": (0xC000003E, _X86_64, True),
  "aarch64": (0xC00000B7, _GENERIC, False),
  "riscv64": (0xC00000F3, _GENERIC, False),
}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
  return struct.pack("=HBBI", code, jt, jf, k)


def _assemble(steps: list[tuple[str | None, int, int, str | None]]) -> bytes:
  """(label, opcode, k, target) steps as instructions: a jump goes to `target` when true
  and on to the next step when false. Classic BPF jumps only forward (its offsets are
  unsigned, so a filter cannot loop), by at most 255: a layout that breaks this raises."""
  at = {label: i for i, (label, _, _, _) in enumerate(steps) if label}
  out = []
  for i, (_, code, k, target) in enumerate(steps):
    jt = at[target] - (i + 1) if target else 0
    if not 0 <= jt <= 255:
      raise ValueError(f"step {i} jumps to {target!r}, {jt} ahead")
    out.append(_insn(code, k, jt=jt))
  return b"".join(out)


def program(machine: str | None = None) -> bytes:
  """The filter for `machine` (default: this one) as struct sock_filter bytes; b"" where
  no system call table is known."""
  machine = machine or platform.machine()
  if machine not in MACHINES:
    return b""
  arch, numbers, x32 = MACHINES[machine]
  denied = sorted({numbers[name] for name in _DENIED if name in numbers})
  # Layout: arch check, nr load, [x32], clone, clone3, socket, socketpair, the denied
  # chain, ALLOW, the family check (ld, jeq per family, EAFNOSUPPORT), the clone flag
  # check (ld, jset), ALLOW, EPERM, ENOSYS.
  steps = [
    (None, _LD_W_ABS, _ARCH, None),
    (None, _JEQ, arch, "nr"),
    (None, _RET, RET_KILL_PROCESS, None),
    ("nr", _LD_W_ABS, _NR, None),
    *([(None, _JGE, X32_BIT, "eperm")] if x32 else []),
    (None, _JEQ, numbers["clone"], "clone"),
    (None, _JEQ, numbers["clone3"], "enosys"),
    (None, _JEQ, numbers["socket"], "family"),
    (None, _JEQ, numbers["socketpair"], "family"),
    *((None, _JEQ, nr, "eperm") for nr in denied),
    (None, _RET, RET_ALLOW, None),
    ("family", _LD_W_ABS, _ARG0, None),  # The low word: the int the kernel reads.
    *((None, _JEQ, family, "allow") for family in sorted(ALLOWED_FAMILIES.values())),
    (None, _RET, RET_ERRNO | EAFNOSUPPORT, None),
    ("clone", _LD_W_ABS, _ARG0, None),
    (None, _JSET, CLONE_NEW_MASK, "eperm"),
    ("allow", _RET, RET_ALLOW, None),
    ("eperm", _RET, RET_ERRNO | EPERM, None),
    ("enosys", _RET, RET_ERRNO | ENOSYS, None),
  ]
  return _assemble(steps)


def evaluate(prog: bytes, *, arch: int, nr: int, arg0: int = 0) -> int:
  """What the kernel would return for one system call under `prog` (a classic BPF
  interpreter for the instructions `program` uses; tests check the filter with it).
  `arg0` is the whole 64-bit register (a negative int as the C library passes it,
  sign-extended), so a filter that read the wrong word would be caught."""
  arg0 &= 0xFFFFFFFFFFFFFFFF
  data = {_NR: nr, _ARCH: arch, _ARG0: arg0 & 0xFFFFFFFF, _ARG0_HIGH: arg0 >> 32}
  insns = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
  pc, acc = 0, 0
  while True:
    code, jt, jf, k = insns[pc]
    pc += 1
    if code == _LD_W_ABS:
      acc = data[k]
    elif code == _RET:
      return k
    else:
      taken = {_JEQ: acc == k, _JGE: acc >= k, _JSET: bool(acc & k)}[code]
      pc += jt if taken else jf
