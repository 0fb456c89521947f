"""The seccomp filter's socket rule: socket(2) and socketpair(2) for AF_UNIX, AF_INET and
AF_INET6 only, EAFNOSUPPORT for every other address family.

A red team reached the host's vsock space from inside the sandbox (no namespace covers
AF_VSOCK), so two concurrent sandboxes could signal each other through it. The numbers
here are copied by hand from linux/socket.h and the system call tables, not taken from
`socket` or from `seccomp`, so a wrong number in either shows up as a failure.
"""

import errno
import platform
import socket
import warnings

import pytest
from test_sandbox import needs_namespaces, run

from grpo_jax.verifiers import sandbox
from grpo_jax.verifiers.sandbox import runner, seccomp

EAFNOSUPPORT = 97
STREAM, DGRAM, RAW, RDM, SEQPACKET = 1, 2, 3, 4, 5
ALLOWED = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10}
# Every family linux/socket.h names (AF_MAX is 46) but the allowed three: name -> (number,
# a socket type and protocol the family takes, so that without the filter a kernel that
# has the family would make the socket).
DENIED = {
  "AF_UNSPEC": (0, STREAM, 0),
  "AF_AX25": (3, DGRAM, 0),
  "AF_IPX": (4, DGRAM, 0),
  "AF_APPLETALK": (5, DGRAM, 0),
  "AF_NETROM": (6, SEQPACKET, 0),
  "AF_BRIDGE": (7, RAW, 0),
  "AF_ATMPVC": (8, DGRAM, 0),
  "AF_X25": (9, SEQPACKET, 0),
  "AF_ROSE": (11, SEQPACKET, 0),
  "AF_DECnet": (12, SEQPACKET, 0),
  "AF_NETBEUI": (13, DGRAM, 0),
  "AF_SECURITY": (14, DGRAM, 0),
  "AF_KEY": (15, RAW, 2),  # PF_KEY_V2.
  "AF_NETLINK": (16, RAW, 0),  # NETLINK_ROUTE.
  "AF_PACKET": (17, DGRAM, 0),
  "AF_ASH": (18, DGRAM, 0),
  "AF_ECONET": (19, DGRAM, 0),
  "AF_ATMSVC": (20, DGRAM, 0),
  "AF_RDS": (21, SEQPACKET, 0),
  "AF_SNA": (22, DGRAM, 0),
  "AF_IRDA": (23, SEQPACKET, 0),
  "AF_PPPOX": (24, STREAM, 0),  # PX_PROTO_OE.
  "AF_WANPIPE": (25, RAW, 0),
  "AF_LLC": (26, DGRAM, 0),
  "AF_IB": (27, STREAM, 0),
  "AF_MPLS": (28, DGRAM, 0),
  "AF_CAN": (29, RAW, 1),  # CAN_RAW.
  "AF_TIPC": (30, RDM, 0),
  "AF_BLUETOOTH": (31, SEQPACKET, 0),  # BTPROTO_L2CAP.
  "AF_IUCV": (32, STREAM, 0),
  "AF_RXRPC": (33, DGRAM, 0),
  "AF_ISDN": (34, RAW, 0),
  "AF_PHONET": (35, DGRAM, 0),
  "AF_IEEE802154": (36, DGRAM, 0),
  "AF_CAIF": (37, SEQPACKET, 0),
  "AF_ALG": (38, SEQPACKET, 0),
  "AF_NFC": (39, SEQPACKET, 0),
  "AF_VSOCK": (40, STREAM, 0),
  "AF_KCM": (41, DGRAM, 0),
  "AF_QIPCRTR": (42, DGRAM, 0),
  "AF_SMC": (43, STREAM, 0),
  "AF_XDP": (44, RAW, 0),
  "AF_MCTP": (45, DGRAM, 0),
}
# (socket, socketpair) per table: asm/unistd_64.h and asm-generic/unistd.h.
SOCKET_CALLS = {"x86_64": (41, 53), "aarch64": (198, 199), "riscv64": (198, 199)}
ALLOW = seccomp.RET_ALLOW
REFUSED = seccomp.RET_ERRNO | EAFNOSUPPORT


def verdicts(machine: str, arg0: int) -> tuple[int, int]:
  """What (socket, socketpair) with family `arg0` get from `machine`'s filter."""
  arch, numbers, _ = seccomp.MACHINES[machine]
  prog = seccomp.program(machine)
  return tuple(
    seccomp.evaluate(prog, arch=arch, nr=numbers[name], arg0=arg0)
    for name in ("socket", "socketpair")
  )


def model(machine: str, nr: int, arg0: int) -> int:
  """The whole filter's rule, written out plainly, for one call of `machine`'s ABI."""
  _, numbers, x32 = seccomp.MACHINES[machine]
  low = arg0 & 0xFFFFFFFF
  eperm = seccomp.RET_ERRNO | seccomp.EPERM
  if x32 and nr >= seccomp.X32_BIT:
    return eperm
  if nr == numbers["clone"]:
    return eperm if low & seccomp.CLONE_NEW_MASK else ALLOW
  if nr == numbers["clone3"]:
    return seccomp.RET_ERRNO | seccomp.ENOSYS
  if nr in (numbers["socket"], numbers["socketpair"]):
    return ALLOW if low in ALLOWED.values() else REFUSED
  return eperm if nr in numbers.values() else ALLOW


# ---------------------------------------------------------------------------------------
# The filter, through the in-repo BPF interpreter, for every machine with a table.


def test_the_allow_list_and_the_system_call_numbers_are_the_kernels():
  assert errno.EAFNOSUPPORT == seccomp.EAFNOSUPPORT == EAFNOSUPPORT
  assert seccomp.ALLOWED_FAMILIES == ALLOWED
  assert set(seccomp.MACHINES) == set(SOCKET_CALLS)
  for machine, (_, numbers, _) in seccomp.MACHINES.items():
    assert (numbers["socket"], numbers["socketpair"]) == SOCKET_CALLS[machine], machine
    assert "socketcall" not in numbers  # No such call in these 64-bit ABIs.
  if hasattr(socket, "AF_VSOCK"):  # The host's headers agree with the hand-copied table.
    for name, (family, *_) in {**DENIED, **{k: (v,) for k, v in ALLOWED.items()}}.items():
      assert getattr(socket, name, family) == family, name


@pytest.mark.parametrize("machine", sorted(seccomp.MACHINES))
def test_allowed_families_are_allowed(machine):
  for name, family in ALLOWED.items():
    assert verdicts(machine, family) == (ALLOW, ALLOW), (machine, name)


@pytest.mark.parametrize("name", sorted(DENIED))
def test_a_denied_family_gets_eafnosupport(name):
  family = DENIED[name][0]
  for machine in seccomp.MACHINES:
    assert verdicts(machine, family) == (REFUSED, REFUSED), (machine, name)


def test_every_family_number_outside_the_allow_list_is_refused():
  huge = [46, 63, 64, 255, 256, 2**16, 2**31 - 1, 2**31, 2**32 - 1, -1, -40, 2**63, 2**64 - 1]
  for machine in seccomp.MACHINES:
    for family in [*range(64), *huge]:
      expected = ALLOW if family in ALLOWED.values() else REFUSED
      assert verdicts(machine, family) == (expected, expected), (machine, family)


def test_only_the_low_word_of_the_family_is_compared():
  # The kernel declares the family an int and truncates the 64-bit register to it, so
  # (1 << 32) | 1 makes an AF_UNIX socket: the filter decides on the same 32 bits.
  for machine in seccomp.MACHINES:
    for high in (1 << 32, 0xFFFFFFFF << 32):
      for family in ALLOWED.values():
        assert verdicts(machine, high | family) == (ALLOW, ALLOW), (machine, high, family)
      for family in (0, 16, 17, 40, 0x7FFFFFFF):
        assert verdicts(machine, high | family) == (REFUSED, REFUSED), (machine, high, family)


@pytest.mark.parametrize("machine", sorted(seccomp.MACHINES))
def test_every_other_system_call_is_unchanged(machine):
  arch, numbers, x32 = seccomp.MACHINES[machine]
  prog = seccomp.program(machine)
  args = (0, 1, 2, 10, 16, 40, 0x10000000, (1 << 32) | 40, 2**64 - 1)
  for nr in range(460):
    for arg0 in args:
      got = seccomp.evaluate(prog, arch=arch, nr=nr, arg0=arg0)
      assert got == model(machine, nr, arg0), (machine, nr, arg0)
  for name in ("inotify_init1", "unshare", "mount", "bpf", "ptrace", "io_uring_setup"):
    assert seccomp.evaluate(prog, arch=arch, nr=numbers[name]) == seccomp.RET_ERRNO | 1, name
  connect = {"x86_64": 42, "aarch64": 203, "riscv64": 203}[machine]
  assert seccomp.evaluate(prog, arch=arch, nr=connect, arg0=40) == ALLOW  # Not the family.
  if x32:  # x32's socket, AF_UNIX: refused with the rest of that ABI.
    x32_socket = seccomp.evaluate(prog, arch=arch, nr=seccomp.X32_BIT | 41, arg0=1)
    assert x32_socket == seccomp.RET_ERRNO | seccomp.EPERM
  for i386 in (102, 359):  # socketcall and socket of the i386 ABI: killed by the arch.
    assert seccomp.evaluate(prog, arch=0x40000003, nr=i386, arg0=40) == seccomp.RET_KILL_PROCESS


@pytest.mark.parametrize("machine", sorted(seccomp.MACHINES))
def test_the_program_is_classic_bpf_that_jumps_forward_inside_itself(machine):
  prog = seccomp.program(machine)
  insns = [prog[i : i + 8] for i in range(0, len(prog), 8)]
  assert len(prog) % 8 == 0 and len(insns) <= 4096  # BPF_MAXINSNS.
  for pc, insn in enumerate(insns):
    code, jt, jf = insn[0] | insn[1] << 8, insn[2], insn[3]
    if code & 0x07 == 0x05:  # BPF_JMP: both targets inside the program.
      assert pc + 1 + max(jt, jf) < len(insns), (machine, pc)
  assert insns[-1][0] == 0x06  # Falls off the end nowhere.


# ---------------------------------------------------------------------------------------
# The real kernel, through the sandbox: with namespaces where they work, and without (the
# filter applies in both modes).

ISOLATIONS = pytest.mark.parametrize(
  "isolation",
  [
    pytest.param("namespaces", marks=needs_namespaces),
    "none",
  ],
)

PROBE = """
import ctypes, socket

def attempt(make, *args):
  try:
    made = make(*args)
  except OSError as e:
    return e.errno
  for s in made if isinstance(made, tuple) else (made,):
    s.close()
  return None

def sockets():
  return {name: attempt(socket.socket, *args) for name, args in TABLE.items()}

def pairs():
  return {name: attempt(socket.socketpair, *args) for name, args in TABLE.items()}

def raw_socket(nr, family):
  # socket(2) with a full 64-bit first argument: the family of what it made, or -errno.
  libc = ctypes.CDLL(None, use_errno=True)
  libc.syscall.restype = ctypes.c_long
  args = (ctypes.c_long(v) for v in (nr, family, socket.SOCK_DGRAM, 0))
  fd = libc.syscall(*args)
  if fd < 0:
    return -ctypes.get_errno()
  with socket.socket(fileno=fd) as s:
    return int(s.family)
"""


def sandboxed(code, tests, isolation, monkeypatch):
  # isolation="none" warns once per process: here into a fresh set, so the tests of
  # tests/verifiers/test_sandbox.py that expect the warning still see it in this worker.
  monkeypatch.setattr(runner, "_WARNED", set())
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    result = run(code, tests, isolation=isolation, timeout_s=10.0)
  assert result.isolation == isolation, result
  return result


def probe_run(tests, isolation, monkeypatch):
  return sandboxed(PROBE + f"TABLE = {DENIED!r}\n", tests, isolation, monkeypatch)


@ISOLATIONS
def test_vsock_is_eafnosupport_inside_the_sandbox(isolation, monkeypatch):
  result = probe_run(
    [
      sandbox.Test("sockets()['AF_VSOCK']", EAFNOSUPPORT),
      sandbox.Test("pairs()['AF_VSOCK']", EAFNOSUPPORT),
    ],
    isolation,
    monkeypatch,
  )
  assert result.verdict == "pass", result


@ISOLATIONS
def test_every_denied_family_is_eafnosupport_inside_the_sandbox(isolation, monkeypatch):
  everything = {name: EAFNOSUPPORT for name in DENIED}
  result = probe_run(
    [
      # First, so the detail names only the families that got through.
      sandbox.Test("{k: v for k, v in sockets().items() if v != 97}", {}),
      sandbox.Test("sockets()", everything),
      sandbox.Test("pairs()", everything),
    ],
    isolation,
    monkeypatch,
  )
  assert result.verdict == "pass", result


@ISOLATIONS
def test_the_kernel_reads_the_low_word_of_the_family_inside_the_sandbox(isolation, monkeypatch):
  nr = seccomp.MACHINES[platform.machine()][1]["socket"]
  result = probe_run(
    [
      sandbox.Test(f"raw_socket({nr}, (1 << 32) | 1)", 1),  # An AF_UNIX socket.
      sandbox.Test(f"raw_socket({nr}, (1 << 32) | 40)", -EAFNOSUPPORT),
      sandbox.Test(f"raw_socket({nr}, 40)", -EAFNOSUPPORT),
    ],
    isolation,
    monkeypatch,
  )
  assert result.verdict == "pass", result


@ISOLATIONS
def test_ordinary_code_keeps_its_sockets_inside_the_sandbox(isolation, monkeypatch):
  try:
    socket.socket(socket.AF_INET6).close()
    inet6 = None
  except OSError as e:  # A host booted without IPv6 refuses it everywhere.
    inet6 = e.errno
  code = """
    import asyncio, multiprocessing, socket

    def made(family, kind):
      try:
        socket.socket(family, kind).close()
      except OSError as e:
        return e.errno
      return None

    def echo():
      a, b = socket.socketpair()
      with a, b:
        a.sendall(b'ping')
        return b.recv(4)

    def seqpacket():
      a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
      with a, b:
        a.send(b'one')
        return b.recv(16)

    def pipe():
      here, there = multiprocessing.Pipe()
      here.send([1, 2])
      return there.recv()

    def loop():
      async def main():
        await asyncio.sleep(0)
        return 'ran'
      return asyncio.run(main())
  """
  result = sandboxed(
    code,
    [
      sandbox.Test("echo()", b"ping"),
      sandbox.Test("seqpacket()", b"one"),
      sandbox.Test("pipe()", [1, 2]),
      sandbox.Test("loop()", "ran"),
      sandbox.Test("made(socket.AF_UNIX, socket.SOCK_DGRAM)", None),
      sandbox.Test("made(socket.AF_INET, socket.SOCK_STREAM)", None),
      sandbox.Test("made(socket.AF_INET, socket.SOCK_DGRAM)", None),
      sandbox.Test("made(socket.AF_INET6, socket.SOCK_STREAM)", inet6),
    ],
    isolation,
    monkeypatch,
  )
  assert result.verdict == "pass", result
