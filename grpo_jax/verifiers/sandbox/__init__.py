"""Run untrusted Python against hidden unit tests, in a sandboxed process, for a reward.

    tests = [sandbox.parse_test("assert add(2, 3) == 5"), ...]
    sandbox.check("auto")                     # at startup: one line, or sandbox.Unavailable
    result = sandbox.run(code, tests)         # Result(verdict="pass", cause="pass", ...)
    result.verdict                            # "pass" | "fail" | "could_not_run"

An RL policy searches for whatever raises its reward, so the sandbox is built against a
policy that games it: it must not be able to pass without computing the answer, to opt
out of a zero, to read the tests, to stall or bloat the caller, or to harm the host.

Verdicts (the rule a policy cannot game). "could_not_run" only when no candidate code ran:
the sandbox failed to start (setup, a fork, pipe or control group the host could not
give, an interpreter that did not start within the timeout) or refused (namespaces asked
for and not working here). From the moment the code may run, every way it can end that is
not "every test's value equalled its expected value" is "fail", with a cause:

* "wrong": a value differed (also a value that is not a plain literal, and one larger
  than any value equal to the expected one can be);
* "raised": the code or a test raised (a syntax error, or an exception raised on purpose
  on inputs it is unsure of);
* "timeout": the wall-clock limit (timeout_s, the row's budget) or the CPU limit;
* "memory": a MemoryError, or the out-of-memory killer in the run's control group;
* "crash": the program exited or was killed by a signal (its own, or a resource limit:
  file size) before the tests finished, or killed its supervisor;
* "tampered": the result channel held records without the run's nonce, out of order,
  duplicated, after the end, more or longer records than allowed, or a record the
  harness never writes (a value that is not a repr of the literal types, one that the
  parser refuses).

A definite wrong value wins over a later timeout or crash. The code task makes "fail" a
reward of 0 and "could_not_run" unscorable (`tasks.code`), and reports the cause per row
(`reward/outcome/<cause>`), so a policy that learns to fail loudly earns zeros and the
shift shows in the metrics. `Result.cause` carries it (CAUSES).

Tests are ``assert <call> == <expected>`` statements (MBPP style). ``parse_test`` splits
one, in this process, into the call (source text) and the expected value, a literal
(``ast.literal_eval``; also ``set(...)``, ``frozenset(...)``, ``tuple(...)``,
``list(...)``, ``dict(...)`` of literals), else ``ValueError``.

The verdict channel. The expected values never leave this process: the child gets the
code and the call expressions only. A harness in the child runs the code, evaluates each
call, and writes one record per test, ``<nonce> <i>:ok <repr(value)>`` (or ``raised``,
``nonliteral`` ...), to a pipe of its own (not stdout, not the exit code), then ``<nonce>
end``. A value is reported only when it is made of exact built-in literal types (int,
float, complex, str, bytes, bool, None, tuple, list, dict, set, frozenset; no subclasses;
the harness binds those types before the code runs), so its ``repr`` is the built-in one.
The code can still find the nonce in its own process and write records of its own, so
this process trusts nothing on the pipe but what it can check: it parses each repr with
the same restricted evaluator as the expected values and compares with ``==``. To write a
passing record the code must know the expected value, i.e. compute the right answer.
What this process reads is bounded before the run starts (`channel`): n + 3 records of at
most max_result_chars + 2 KB (n tests), the reading stops at the first record past them
("tampered"), and a repr is parsed only when it is no longer than an equal value can be
(`values.max_equal_repr`) and only after one linear pass over its tokens has bounded its
nesting (`values.read_reported`; Python's parser recurses, and a repr such as ``---...1``
made it raise RecursionError in the caller): a run costs the caller at most what its own
tests' expected values cost to parse, whatever the code sends. The reading never raises
(`channel.judge`): any record it cannot read, and any failure while reading, is "fail"
(tampered), never an error, so a candidate cannot make its row unscorable through what it
writes. Whether the sandbox started (``ready``,
written before any candidate code runs) and how the code's process ended come from
processes that never run candidate code, over a second pipe the code's process closes
first.

Isolation (``isolation=``): "auto" (default) and "namespaces" both require Linux
namespaces; no mode falls back to running without them. ``check`` (called at startup by
the code task and environment) probes up to three times and raises ``Unavailable`` (one
clear line: why, and what to do) when no probe passes; a probe that passed is remembered
for the process, one that failed is not, so a transient failure during a run is
"could_not_run" for that call only. "none" runs without namespace isolation and says so
in one warning line at startup: trusted code and tests only.

In every mode the child is ``python -I -S`` (isolated: no PYTHON* variables, no user
site, no site-packages), started with an empty environment (the trainer's variables and
secrets are not passed), stdin on /dev/null, stdout/stderr of the code on /dev/null, in
its own session (process group), with limits set before any candidate code runs
(`Limits`): RLIMIT_CPU (cpu_s), RLIMIT_AS (memory_mb), RLIMIT_FSIZE (file_mb),
RLIMIT_NPROC (processes), RLIMIT_NOFILE (open_files), RLIMIT_CORE=0, no_new_privs and the
seccomp filter (`seccomp`: no inotify, fanotify, keys or message queues, no new
namespaces or mounts, no ptrace, bpf, io_uring or perf; ``socket`` and ``socketpair``
only for AF_UNIX, AF_INET and AF_INET6, the families the sandbox's namespaces contain,
and EAFNOSUPPORT for every other, as on a kernel built without it: AF_VSOCK, AF_NETLINK,
AF_PACKET, AF_ALG... reach host-wide spaces no namespace covers, and two sandboxes could
signal each other over vsock). The wall-clock timeout
(timeout_s, from the interpreter's start to the last result) SIGKILLs the whole process
group; a caller that spent part of the row's budget on the completion before the run
(extracting its code: `tasks.code`) passes ``spent_s``, and the run ends that much
earlier, so the whole row stays within timeout_s. The sandbox dies with its caller (PR_SET_PDEATHSIG), so a reward worker killed by
the pool's timeout takes its sandbox along. The code's namespace has ``__name__ ==
"__candidate__"``, so an ``if __name__ == "__main__":`` block does not run.

The whole sandbox's budget (`cgroup`): where a control group can be made (cgroup v2, or
v1's memory and pids hierarchies: root on most hosts), each run gets one, with memory_mb
(+64 MB for its four supervising processes) of memory and processes + 4 processes in all;
then ``processes`` defaults to 16. Without a control group only the per-process limits
hold, so ``processes`` defaults to 4: at most 4 × memory_mb (2 GB by default) in all.
Each run's group is made beside the trainer's own group (in its parent, or at the
hierarchy's root), never inside it, so a run's memory does not count against the
trainer's group; its own limit bounds it. Every sandbox process also runs with
``oom_score_adj`` 1000 (the trainer keeps its own score), so wherever an out-of-memory
kill happens (a run's group that had to nest in the trainer's because nothing outside was
writable, a shared ancestor's limit, the whole host), the kernel kills the candidate,
never the trainer. (Before round two, v1 runs nested in the trainer's group, and at that
group's limit the kernel killed the trainer, the largest process in it.)

"namespaces" adds, with unprivileged user namespaces and mount_setattr (Linux >= 5.12),
on x86_64/aarch64/riscv64/ppc64le/s390x:

* identity: started as root, the sandbox becomes a uid and gid no account has
  (``IDENTITY``) before it makes any namespace, so every per-user count of the kernel
  (processes, inotify instances, namespaces, ...) taken inside is charged to that uid,
  never to root; otherwise it runs as the launching user (the seccomp filter removes the
  calls that take such counts);
* network: a new, empty network namespace (not even loopback is up);
* filesystem (`layout`): a new root holding only, read-only, the system directories
  /usr /bin /sbin /lib /lib32 /lib64 /libx32 (those that exist), /etc/ld.so.cache, the
  Python installation (wherever it is, /tmp included), /dev/null, zero, random and
  urandom, and a writable private tmpfs /tmp of tmp_mb (the working directory). Every
  directory packages are installed into (site-packages, dist-packages, the sys.path
  entries outside the standard library) and grpo_jax's own directory are covered by an
  empty tmpfs: the code sees the standard library only, never an installed package's
  data (the code task refuses to run if its problems file would be visible:
  ``visible``). Not there: /home, /root, /work, the host's /tmp, /etc, /proc, /sys, /run,
  /var. The mounts are locked (the code runs in a nested user namespace, and cannot call
  mount or umount);
* processes: a new PID namespace (all of the code's processes die when the sandbox's
  init dies, so a fork bomb or a daemonised child cannot outlive the timeout), plus new
  IPC and UTS namespaces.

Not contained, even with namespaces: the kernel's attack surface beyond what the filter
removes; reading the Python installation's standard library and the system libraries;
timing side channels; on a machine without a system call table here (ppc64le, s390x), the
filter. With "none" the code can read and write whatever the trainer's user can (only the
working directory is a fresh temporary one), reach the network, see other processes, and
escape the kill by calling setsid(). Use "none" only for trusted code or tests.

Cost: one ``python -I -S`` start, three forks and a control group per call:
experiments/bench_sandbox.py measures it (docs/benchmarks.md).
"""

from grpo_jax.verifiers.sandbox.layout import visible
from grpo_jax.verifiers.sandbox.runner import (
  CAUSES,
  FAIL_CAUSES,
  IDENTITY,
  ISOLATIONS,
  VERDICTS,
  Limits,
  Result,
  Unavailable,
  check,
  describe,
  namespaces_unavailable,
  run,
)
from grpo_jax.verifiers.sandbox.values import Test, literal_value, parse_test, parse_value

__all__ = [
  "CAUSES",
  "FAIL_CAUSES",
  "IDENTITY",
  "ISOLATIONS",
  "VERDICTS",
  "Limits",
  "Result",
  "Test",
  "Unavailable",
  "check",
  "describe",
  "literal_value",
  "namespaces_unavailable",
  "parse_test",
  "parse_value",
  "run",
  "visible",
]
