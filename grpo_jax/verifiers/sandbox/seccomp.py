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
  lookup_dcookie, uselib.

Each returns EPERM (clone3: ENOSYS). A system call of another ABI than the machine's
(x86_64's i386 and x32 entries) kills the process: the numbers above would not match.
Everything else (files in the sandbox's own view, pipes, fork, threads, sockets in the
empty network namespace, signals to its own processes) is allowed.

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
EPERM, ENOSYS = 1, 38
_NR, _ARCH, _ARG0 = 0, 4, 16  # Offsets in struct seccomp_data (args[0]'s low word: LE).
X32_BIT = 0x40000000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET.
CLONE_NEW_MASK = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000
CLONE_NEW_MASK |= 0x20000000 | 0x40000000

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
  "clone": 56, "clone3": 435, "ptrace": 101, "syslog": 103, "uselib": 134, "personality": 135,
  "vhangup": 153, "pivot_root": 155, "acct": 163, "mount": 165, "umount2": 166, "swapon": 167,
  "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171, "init_module": 175,
  "delete_module": 176, "quotactl": 179, "lookup_dcookie": 212, "mq_open": 240,
  "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250, "inotify_init": 253,
  "inotify_add_watch": 254, "unshare": 272, "inotify_init1": 294, "perf_event_open": 298,
  "fanotify_init": 300, "fanotify_mark": 301, "name_to_handle_at": 303,
  "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311,
  "finit_module": 313, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323,
  "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
  "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
  "mount_setattr": 442, "memfd_secret": 447,
}  # fmt: skip
# asm-generic/unistd.h (aarch64, riscv64): no inotify_init, lookup_dcookie 18, no uselib.
_GENERIC = {
  "lookup_dcookie": 18, "inotify_init1": 26, "inotify_add_watch": 27, "umount2": 39,
  "mount": 40, "pivot_root": 41, "vhangup": 58, "quotactl": 60, "acct": 89, "personality": 92,
  "unshare": 97, "kexec_load": 104, "init_module": 105, "delete_module": 106, "syslog": 116,
  "ptrace": 117, "reboot": 142, "sethostname": 161, "setdomainname": 162, "mq_open": 180,
  "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220, "swapon": 224,
  "swapoff": 225, "perf_event_open": 241, "fanotify_init": 262, "fanotify_mark": 263,
  "name_to_handle_at": 264, "open_by_handle_at": 265, "setns": 268, "process_vm_readv": 270,
  "process_vm_writev": 271, "finit_module": 273, "bpf": 280, "userfaultfd": 282,
  "kexec_file_load": 294, "io_uring_setup": 425, "io_uring_enter": 426,
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


def program(machine: str | None = None) -> bytes:
  """The filter for `machine` (default: this one) as struct sock_filter bytes; b"" where
  no system call table is known."""
  machine = machine or platform.machine()
  if machine not in MACHINES:
    return b""
  arch, numbers, x32 = MACHINES[machine]
  denied = sorted({numbers[name] for name in _DENIED if name in numbers})
  # Layout: arch check, nr load, [x32], clone, clone3, the denied chain, ALLOW, the clone
  # flag check (ld, jset, ALLOW), EPERM, ENOSYS. Jumps are forward only, relative.
  chain = ([("jge", X32_BIT, "eperm")] if x32 else []) + [
    ("jeq", numbers["clone"], "clone"),
    ("jeq", numbers["clone3"], "enosys"),
    *(("jeq", nr, "eperm") for nr in denied),
  ]
  tail = [
    ("ret", RET_ALLOW, "allow"),
    (_LD_W_ABS, _ARG0, "clone"),
    ("jset", CLONE_NEW_MASK, "eperm"),
    ("ret", RET_ALLOW, None),
    ("ret", RET_ERRNO | EPERM, "eperm"),
    ("ret", RET_ERRNO | ENOSYS, "enosys"),
  ]
  out = [_insn(_LD_W_ABS, _ARCH), _insn(_JEQ, arch, jt=1), _insn(_RET, RET_KILL_PROCESS)]
  out.append(_insn(_LD_W_ABS, _NR))
  start = len(out) + len(chain)
  labels = {t[2]: start + i for i, t in enumerate(tail) if t[2]}
  for i, (op, k, label) in enumerate(chain, start=4):
    code = {"jge": _JGE, "jeq": _JEQ}[op]
    out.append(_insn(code, k, jt=labels[label] - (i + 1)))
  for i, (op, k, label) in enumerate(tail, start=start):
    if op == "ret":
      out.append(_insn(_RET, k))
    elif op == "jset":
      out.append(_insn(_JSET, k, jt=labels[label] - (i + 1)))
    else:
      out.append(_insn(op, k))
  return b"".join(out)


def evaluate(prog: bytes, *, arch: int, nr: int, arg0: int = 0) -> int:
  """What the kernel would return for one system call under `prog` (a classic BPF
  interpreter for the instructions `program` uses; tests check the filter with it)."""
  data = {_NR: nr, _ARCH: arch, _ARG0: arg0 & 0xFFFFFFFF}
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
