"""The sandbox's child program, run as ``python -I -S -c <this file's text>``.

Never imported by grpo_jax (importing it does nothing): `runner` reads this file's text
and starts it with the job (a marshal dict) on stdin. It uses the standard library only.

Processes, with namespaces, started as root: outer (the Popen child) -> C (in a mount
namespace of its own, builds the new root and pivots into it as real root; becomes the
dedicated identity; unshares user, mount, net, pid, ipc and uts namespaces, the mount
namespace a copy of the new root whose mounts are now locked; outer writes the uid/gid
maps) -> init (pid 1) -> worker (nested user + mount namespace; rlimits, no_new_privs,
the seccomp filter; runs the code). Started as another user, C unshares first and init
builds the new root inside the namespaces. Without namespaces: outer (supervisor) ->
worker (rlimits, no_new_privs, seccomp). The supervisor (init or outer) reports how the
worker ended on the status pipe, which the worker closes before running candidate code.

The OOM killer's first choice: outer sets its own ``oom_score_adj`` to 1000 before anything
else, and every process it starts inherits it (fork, exec, setuid and unshare keep it; the
worker itself has no /proc to write it in once the new root is in place). Where a run's
memory is charged to a group that also holds the trainer (a nested cgroup v1 group, a
common ancestor's limit, the whole host), the kernel kills a sandbox process, never the
trainer. Raising one's own score needs no privilege; written as root it is also the floor
(oom_score_adj_min) that the code, without CAP_SYS_RESOURCE, cannot lower it below. Best
effort: where /proc cannot be written the run goes on as before.
"""

import marshal
import os
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 4096, 16384, 1 << 18
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, AT_FDCWD, AT_RECURSIVE = 1, 2, -100, 0x8000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 1, 4, 38, 22
SECCOMP_MODE_FILTER, MNT_DETACH = 2, 2
ATOMS = (int, float, complex, str, bytes, bool, type(None))
CONTAINERS = (tuple, list, set, frozenset)


def send(fd, nonce, *words):
  data = " ".join((nonce,) + words).encode("utf-8", "backslashreplace") + b"\n"
  while data:
    data = data[os.write(fd, data) :]


def fail_setup(job, error):
  # Before any candidate code runs: this process is trusted.
  send(job["status_fd"], job["nonce"], "setup_error", repr(f"{type(error).__name__}: {error}"))
  os._exit(70)


class Libc:
  def __init__(self):
    import ctypes

    self.ctypes, self.lib = ctypes, ctypes.CDLL(None, use_errno=True)

  def __call__(self, name, *args):
    if getattr(self.lib, name)(*args) != 0:
      err = self.ctypes.get_errno()
      raise OSError(err, f"{name}{args[:2]}: {os.strerror(err)}")


def die_with_parent(libc, parent, signum=9):
  libc("prctl", PR_SET_PDEATHSIG, signum, 0, 0, 0)
  if parent and os.getppid() != parent:
    os._exit(71)


def kill_group_on_sigterm():
  # The outer process's parent-death signal: take the whole process group down with it
  # (in "none" mode the code's own children have no parent-death signal).
  import _signal

  _signal.signal(15, lambda signum, frame: os.killpg(0, 9))


def first_to_die():
  # oom_score_adj 1000, inherited by every process of the sandbox (module docstring).
  try:  # noqa: SIM105 -- no contextlib: the harness imports as little as it can.
    write_file("/proc/self/oom_score_adj", "1000")
  except OSError:
    pass


def main():
  first_to_die()
  job = marshal.loads(sys.stdin.buffer.read())
  null = os.open("/dev/null", os.O_RDWR)
  os.dup2(null, 0)
  os.umask(0o022)
  try:
    for path in job["join"]:  # The v1 control groups: this (single) thread joins itself.
      fd = os.open(path, os.O_WRONLY)
      try:
        os.write(fd, b"0")
      finally:
        os.close(fd)
    libc = Libc()
    die_with_parent(libc, job["parent"], signum=15)
    if not job["isolate"]:
      os.chdir(job["workdir"])
      return supervise(job, libc, null)
    namespaced(job, libc, null)
  except Exception as e:
    fail_setup(job, e)


def namespaced(job, libc, null):
  ready_r, ready_w = os.pipe()
  go_r, go_w = os.pipe()
  outer = os.getpid()
  pid = os.fork()
  if pid == 0:  # C: (root) build the root, drop; unshare; wait for the maps; start init.
    try:
      os.close(ready_r), os.close(go_w)
      die_with_parent(libc, outer)
      root = os.geteuid() == 0
      if root:  # As real root, in a mount namespace of its own, before any drop.
        libc("unshare", CLONE_NEWNS)
        new_root(job, libc)
      dropped = root and drop_identity(job, libc)
      send(job["status_fd"], job["nonce"], "identity", str(os.geteuid()))
      # Its mount namespace is a copy of the new root (root) or of the host's: the
      # mounts copied into a namespace of a less privileged user namespace are locked.
      libc(
        "unshare",
        CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS,
      )
      os.write(ready_w, b"d" if dropped else b"r" if root else b"u")
      if os.read(go_r, 1) != b"g":
        os._exit(72)
      init = os.fork()
      if init == 0:
        return init_main(job, libc, null, build=not root)
      os.close(job["status_fd"]), os.close(job["results_fd"])
      os._exit(wait(init))
    except Exception as e:
      fail_setup(job, e)
  os.close(job["results_fd"])
  os.close(ready_w), os.close(go_r)  # A C that failed closes the last ready_w: EOF here.
  kill_group_on_sigterm()
  how = os.read(ready_r, 1)
  if how in (b"d", b"r", b"u"):
    uid = {b"d": job["identity"], b"r": 0, b"u": os.geteuid()}[how]
    map_ids(pid, uid=uid, privileged=how != b"u")
    os.write(go_w, b"g")
  os.close(job["status_fd"])
  os._exit(wait(pid))


def drop_identity(job, libc):
  # Started as root: become the dedicated identity before any user namespace exists, so
  # every per-user kernel count the code takes (processes, inotify, namespaces...) is
  # charged to it, not to root. Refused where root may not use that uid (a container
  # mapping one uid): then the code runs as root in the namespace (seccomp still applies).
  if job["identity"] < 0:
    return False
  try:
    os.setgroups([])
    os.setgid(job["identity"])
    os.setuid(job["identity"])
  except OSError:
    return False
  libc("prctl", PR_SET_DUMPABLE, 1, 0, 0, 0)  # The outer process writes our maps.
  return True


def map_ids(pid, *, uid, privileged):
  # The namespace's root is the identity C runs as (host uid `uid`). An unprivileged
  # writer must deny setgroups first; root (the outer process) need not.
  if not privileged:
    write_file(f"/proc/{pid}/setgroups", "deny")
  write_file(f"/proc/{pid}/uid_map", f"0 {uid} 1\n")
  write_file(f"/proc/{pid}/gid_map", f"0 {uid if privileged else os.getegid()} 1\n")


def write_file(path, text):
  fd = os.open(path, os.O_WRONLY)
  try:
    os.write(fd, text.encode())
  finally:
    os.close(fd)


def wait(pid):
  _, status = os.waitpid(pid, 0)
  return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def init_main(job, libc, null, *, build):
  try:
    die_with_parent(libc, 0)
    if build:
      new_root(job, libc)
  except Exception as e:
    fail_setup(job, e)
  supervise(job, libc, null)


def under_tmp(path):
  return path == "/tmp" or path.startswith("/tmp/")


def new_root(job, libc):
  # A tmpfs over /tmp (in this private mount namespace) is staged as the new root; the
  # allowed paths are bound into it from fds opened before it covered them. Paths under
  # /tmp go inside the sandbox's own writable /tmp, after it is mounted.
  libc("mount", None, b"/", None, MS_REC | MS_PRIVATE, None)
  fds = [(path, is_dir, os.open(path, os.O_PATH)) for path, is_dir in job["binds"]]
  new = "/tmp"
  libc("mount", b"tmpfs", new.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=755")
  for path, target in job["links"]:
    os.symlink(target, new + path)
  for path, is_dir, fd in fds:
    if not under_tmp(path):
      bind(libc, fd, new + path, is_dir=is_dir)
  masks = [p for p in job["masks"] if not under_tmp(p)]
  mask(libc, new, masks)
  os.makedirs(new + "/tmp", exist_ok=True)
  read_only(libc, new)
  options = f"size={job['tmp_mb']}m,mode=1777".encode()
  libc("mount", b"tmpfs", (new + "/tmp").encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options)
  for path, is_dir, fd in fds:
    if under_tmp(path):
      bind(libc, fd, new + path, is_dir=is_dir)
      read_only(libc, new + path)
  mask(libc, new, [p for p in job["masks"] if under_tmp(p)])
  os.chdir(new)
  libc("syscall", job["pivot_root"], b".", b".")
  libc("umount2", b".", MNT_DETACH)
  os.chdir("/tmp")
  libc("sethostname", b"sandbox", 7)


def bind(libc, fd, dest, *, is_dir):
  if is_dir:
    os.makedirs(dest, exist_ok=True)
  else:
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    os.close(os.open(dest, os.O_CREAT | os.O_WRONLY, 0o644))
  libc("mount", f"/proc/self/fd/{fd}".encode(), dest.encode(), None, MS_BIND | MS_REC, None)
  os.close(fd)


def mask(libc, new, paths):
  # An empty read-only tmpfs over each hidden directory (site-packages, the package).
  flags = MS_RDONLY | MS_NOSUID | MS_NODEV
  for path in paths:
    if os.path.isdir(new + path):
      libc("mount", b"tmpfs", (new + path).encode(), b"tmpfs", flags, b"size=4k,mode=555")


def read_only(libc, path):
  attr = (libc.ctypes.c_uint64 * 4)(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
  libc("syscall", 442, AT_FDCWD, path.encode(), AT_RECURSIVE, attr, 32)  # mount_setattr


def supervise(job, libc, null):
  # Runs the code in a child and reports how it ended; never runs candidate code.
  pid = os.fork()
  if pid == 0:
    worker(job, libc, null)
  os.close(job["results_fd"])
  if not job["isolate"]:
    kill_group_on_sigterm()
  _, status = os.waitpid(pid, 0)
  if os.WIFSIGNALED(status):
    send(job["status_fd"], job["nonce"], "signal", str(os.WTERMSIG(status)))
  else:
    send(job["status_fd"], job["nonce"], "exit", str(os.WEXITSTATUS(status)))
  os._exit(0)


def worker(job, libc, null):
  import resource

  try:
    die_with_parent(libc, 0)
    os.close(job["status_fd"])
    if job["isolate"]:
      libc("unshare", CLONE_NEWUSER | CLONE_NEWNS)  # Locks the mounts.
    libc("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    for name, value in job["rlimits"]:
      soft_hard = (value, value + 1) if name == "RLIMIT_CPU" else (value, value)
      resource.setrlimit(getattr(resource, name), soft_hard)
    if job["seccomp"]:
      install_seccomp(libc, job["seccomp"])
    os.dup2(null, 1)
    os.dup2(null, 2)
  except BaseException as e:
    send(job["results_fd"], job["nonce"], "setup_error", repr(f"{type(e).__name__}: {e}"))
    os._exit(70)
  run_tests(job)


def install_seccomp(libc, program):
  ctypes = libc.ctypes

  class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

  buf = ctypes.create_string_buffer(program, len(program))
  fprog = SockFprog(len(program) // 8, ctypes.addressof(buf))
  libc("prctl", PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0)


def literal_kind(value, limit, atoms, containers, typ):
  # "ok" when value is built from exact built-in literal types only (so repr is theirs).
  # The types come in as arguments bound before the code ran: the code may rebind this
  # module's globals.
  stack, seen = [value], 0
  while stack:
    item = stack.pop()
    seen += 1
    if seen > limit:
      return "oversized"
    t = typ(item)
    if t in atoms:
      continue
    if t in containers:
      stack.extend(item)
    elif t is dict:
      stack.extend(item.keys())
      stack.extend(item.values())
    else:
      return "nonliteral"
  return "ok"


def run_tests(job):
  # Everything this needs is bound now: the code may patch builtins, os or this module.
  out, nonce, limit = job["results_fd"], job["nonce"], job["max_result_chars"]
  rep, typ, length, write, exit_ = repr, type, len, os.write, os._exit
  base, memory_error, exec_, eval_, compile_ = BaseException, MemoryError, exec, eval, compile
  kind_of, atoms, containers = literal_kind, ATOMS, CONTAINERS

  def emit(*words):
    data = " ".join((nonce,) + words).encode("utf-8", "backslashreplace") + b"\n"
    while data:
      data = data[write(out, data) :]

  def describe(error):
    try:
      text = f"{typ(error).__name__}: {error}"
      return rep(text[:300] if typ(text) is str else "?")
    except base:
      return "'?'"

  calls = [compile_(call, f"<test {i}>", "eval") for i, call in enumerate(job["calls"])]
  namespace = {"__name__": "__candidate__", "__builtins__": __builtins__}
  emit("ready")
  try:
    for name in ("prelude", "code", "setup"):
      exec_(compile_(job[name], f"<{name}>", "exec"), namespace)
  except memory_error:
    emit("code:memory")
    calls = []
  except base as e:
    emit("code:raised", describe(e))
    calls = []
  for i, call in enumerate(calls):
    try:
      value = eval_(call, namespace)
    except memory_error:
      emit(f"{i}:memory")
      continue
    except base as e:
      emit(f"{i}:raised", describe(e))
      continue
    try:
      kind = kind_of(value, limit, atoms, containers, typ)
      text = rep(value) if kind == "ok" else ""
    except memory_error:
      kind, text = "memory", ""
    except base:  # ValueError: the repr of an int past the digit limit.
      kind, text = "oversized", ""
    if length(text) > limit:
      kind, text = "oversized", ""
    emit(f"{i}:{kind}", text)
  emit("end")
  exit_(0)


if __name__ == "__main__":
  main()
