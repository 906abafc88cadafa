"""Running commands: plainly for the write tools, confined for the diagnostics a model asks for.

:func:`run_argv` runs an argv without a shell, stdin closed, output capped, killed at a timeout.
:class:`Sandbox` runs it the same way inside bubblewrap (``bwrap``), so that whatever the model
makes a diagnostic command do, it cannot reach the worker:

* new PID, IPC, UTS, cgroup and user namespaces: the worker's processes (and so their
  ``/proc/<pid>/environ``) do not exist in there; ``/proc`` is the sandbox's own;
* the whole filesystem read-only (so ``df`` and ``du`` see every mount), with the worker's own
  files hidden: the config file, the data directory, the working directory, the home directory,
  ``/run/secrets`` and any path of ``sandbox_hide``; ``/tmp`` is an empty read-only tmpfs;
* an unprivileged user (``sandbox_user``, ``nobody`` by default) when the worker runs as root,
  with only the supplementary groups of ``sandbox_groups`` (``adm`` lets it read the logs): bwrap
  runs as root without a user namespace, keeps only the capabilities to change user, and
  ``setpriv`` drops to that user with no capabilities left, so file owners show as they are.
  A worker that is not root runs the sandbox as itself, in a user namespace (where files of
  other users show as owned by ``nobody``);
* a clean environment, no file may be written (``RLIMIT_FSIZE`` 0), no core dumps;
* the host's own mount table, copied in at ``/tmp/.host/mountinfo`` for ``findmnt``, because
  inside the sandbox every mount carries the read-only flag of the bind.

The network namespace is the host's: ``ss`` and ``ip`` must see the host's sockets and links.
Where bubblewrap is missing or the kernel refuses the namespaces, :meth:`Sandbox.unavailable`
says why and nothing runs: the diagnostics are never run unconfined.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = ["BUNDLE_DIR", "HOST_MOUNTINFO", "SAFE_PATH", "Completed", "Sandbox", "run_argv"]

#: The only PATH a command gets, in the sandbox and out: system directories, never the worker's.
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Where the host's mount table appears inside the sandbox.
HOST_MOUNTINFO = "/tmp/.host/mountinfo"
#: Where :meth:`Sandbox.confine` shows a bundle's folder (a skill's scripts run from there).
BUNDLE_DIR = "/tmp/bundle"
#: Paths hidden on every host, besides the worker's own (they hold mounted secrets by convention).
ALWAYS_HIDDEN = ("/run/secrets", "/var/run/secrets", "/etc/ongrid")
STDOUT_LIMIT = 16 * 1024
STDERR_LIMIT = 4 * 1024
#: How long the availability probe may take.
PROBE_TIMEOUT = 10.0


def child_env() -> dict[str, str]:
    """A clean environment: the worker's own variables (API keys) are not a command's business."""
    return {
        "PATH": SAFE_PATH,
        "LC_ALL": "C.UTF-8",
        "SYSTEMD_PAGER": "",
        "SYSTEMD_COLORS": "0",
        "PAGER": "cat",
    }


@dataclass(frozen=True)
class Completed:
    """The outcome of one command: exit code (None on timeout) and capped output."""

    argv: tuple[str, ...]
    exit_code: int | None
    stdout: str
    stderr: str

    def render(self) -> str:
        status = "timed out" if self.exit_code is None else f"exit code: {self.exit_code}"
        parts = [f"$ {shlex.join(self.argv)}", status, "--- stdout ---", self.stdout or "(empty)"]
        if self.stderr:
            parts += ["--- stderr ---", self.stderr]
        return "\n".join(parts)


class _Capture(threading.Thread):
    """Drains one pipe, keeping the first ``limit`` bytes: a child must never block on a full pipe,
    and a huge output must not fill the worker's memory."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        super().__init__(daemon=True)
        self.stream, self.limit = stream, limit
        self.kept, self.total = bytearray(), 0

    def run(self) -> None:
        while chunk := self.stream.read(65536):
            room = self.limit - len(self.kept)
            if room > 0:
                self.kept += chunk[:room]
            self.total += len(chunk)

    def text(self) -> str:
        out = self.kept.decode("utf-8", "replace")
        if self.total > self.limit:
            dropped = self.total - self.limit
            out += f"\n[output truncated at {self.limit // 1024} KiB: {dropped} more bytes]"
        return out


def run_argv(
    argv: Sequence[str],
    timeout: float,
    *,
    pass_fds: Sequence[int] = (),
) -> Completed:
    """Run ``argv`` without a shell, stdin closed, output capped; kill it at ``timeout``."""
    # A session of its own, so a timeout kills the whole process group, grandchildren included.
    with subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
        cwd="/",
        start_new_session=True,
        pass_fds=tuple(pass_fds),
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        out, err = _Capture(proc.stdout, STDOUT_LIMIT), _Capture(proc.stderr, STDERR_LIMIT)
        out.start()
        err.start()
        code = _wait(proc, timeout)
        out.join()
        err.join()
    return Completed(tuple(argv), code, out.text(), err.text())


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The exit code, or ``None`` after killing the process group at ``timeout``."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


class Sandbox:
    """Runs one diagnostic argv confined (see the module docstring). One per worker process.

    ``hide`` are the worker's own paths (config file, data directory, working directory…);
    ``show`` are paths under them that commands must still read (the repository root).
    ``tools_path`` is where ``bwrap``, ``setpriv`` and ``prlimit`` are looked for.
    """

    #: Where :meth:`confine` shows the bundle folder it is given.
    bundle_dir = BUNDLE_DIR

    def __init__(
        self,
        *,
        user: str = "nobody",
        groups: Iterable[str] = (),
        hide: Iterable[str | Path] = (),
        show: Iterable[str | Path] = (),
        tools_path: str = SAFE_PATH,
    ) -> None:
        self.user, self.groups = user, tuple(groups)
        self.hide = _absolute([*ALWAYS_HIDDEN, *hide])
        self.show = [p for p in _absolute(show) if os.path.exists(p)]
        self._lock = threading.Lock()
        self._probed = False
        self._unavailable: str | None = None
        self._bwrap = shutil.which("bwrap", path=tools_path)
        self._prlimit = shutil.which("prlimit", path=tools_path)
        self._setpriv = shutil.which("setpriv", path=tools_path)

    @classmethod
    def for_worker(cls, settings: object, environ: dict[str, str] | None = None) -> Sandbox:
        """The sandbox of a worker built from ``settings``: hides the worker's own files."""
        env = os.environ if environ is None else environ
        own = [
            env.get("ONGRID_CONFIG", ""),
            str(getattr(settings, "data_dir", "") or ""),
            os.getcwd(),
            pwd.getpwuid(os.geteuid()).pw_dir,
            *(str(p) for p in getattr(settings, "sandbox_hide", ()) or ()),
        ]
        repo = str(getattr(settings, "repo_root", "") or "")
        return cls(
            user=str(getattr(settings, "sandbox_user", "") or "nobody"),
            groups=getattr(settings, "sandbox_groups", ()) or (),
            hide=[p for p in own if p and os.path.abspath(p) != "/"],
            show=[repo] if repo else [],
        )

    # -- availability ------------------------------------------------------------------------

    def unavailable(self) -> str | None:
        """Why commands cannot run confined on this host, or ``None`` when they can.

        Probed once (a confined ``true``), so a misconfigured host says so on the first call.
        """
        with self._lock:
            if not self._probed:
                self._unavailable = self._probe()
                self._probed = True
            return self._unavailable

    def _probe(self) -> str | None:
        if self._bwrap is None:
            return "bubblewrap is not installed on this host (Debian: apt-get install bubblewrap)"
        if self._prlimit is None:
            return "prlimit (util-linux) is not installed: cannot forbid writing files"
        try:
            switch = self._switch_user()
        except LookupError as exc:
            return str(exc)
        true = shutil.which("true", path=SAFE_PATH) or "/bin/true"
        try:
            done = self._run([true], PROBE_TIMEOUT, switch)
        except OSError as exc:
            return f"bubblewrap could not start: {exc}"
        if done.exit_code != 0:
            why = done.stderr.strip().splitlines()[-1:] or ["timed out"]
            return f"bubblewrap cannot create its namespaces here: {why[0]}"
        return None

    def _switch_user(self) -> list[str]:
        """Root runs the command as ``user`` (the ``setpriv`` words that do it); anyone else
        runs it as themselves, in a user namespace (``[]``)."""
        if os.geteuid() != 0:
            return []
        if self._setpriv is None:
            raise LookupError("setpriv (util-linux) is not installed: cannot drop privileges")
        try:
            account = pwd.getpwnam(self.user)
        except KeyError:
            raise LookupError(f"sandbox_user {self.user!r} does not exist on this host") from None
        if account.pw_uid == 0:
            raise LookupError("sandbox_user must not be root")
        gids = []
        for name in self.groups:
            try:
                gids.append(str(grp.getgrnam(name).gr_gid))
            except KeyError:
                raise LookupError(f"sandbox_groups: no group {name!r} on this host") from None
        groups = f"--groups={','.join(gids)}" if gids else "--clear-groups"
        return [
            self._setpriv, f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", groups,
            "--inh-caps=-all", "--bounding-set=-all", "--",
        ]  # fmt: skip

    # -- running -----------------------------------------------------------------------------

    def run(self, argv: Sequence[str], timeout: float) -> Completed:
        """Run ``argv`` (its first word an absolute path) confined; :class:`RuntimeError` when
        the sandbox is unavailable, never unconfined."""
        why = self.unavailable()
        if why is not None:
            raise RuntimeError(f"no sandbox: {why}")
        return self._run(argv, timeout, self._switch_user())

    def _run(self, argv: Sequence[str], timeout: float, switch: list[str]) -> Completed:
        assert self._bwrap is not None and self._prlimit is not None
        mountinfo = os.memfd_create("host-mountinfo")
        try:
            os.write(mountinfo, _host_mountinfo())
            os.lseek(mountinfo, 0, os.SEEK_SET)
            limits = [self._prlimit, "--fsize=0", "--core=0", "--"]
            namespaces = self._namespaces(as_root=bool(switch))
            sandbox = [self._bwrap, *namespaces, *self._arguments(mountinfo)]
            done = run_argv(
                [*sandbox, "--", *switch, *limits, *argv], timeout, pass_fds=[mountinfo]
            )
        finally:
            os.close(mountinfo)
        return Completed(tuple(argv), done.exit_code, done.stdout, done.stderr)

    def confine(self, argv: Sequence[str], *, workdir: str) -> list[str]:
        """The command line that runs ``argv`` confined as :meth:`run` does, with ``workdir``
        (a bundle's folder) bound read-only at :data:`BUNDLE_DIR` and its working directory
        there, for a caller that starts and supervises the process itself. Paths of ``argv``
        under ``workdir`` must already be written as under :data:`BUNDLE_DIR`.

        bwrap binds ``workdir`` before it drops privileges, so the folders above it need not be
        readable by the sandbox's user; the files in it must be. :class:`RuntimeError` when
        the sandbox is unavailable: nothing then runs unconfined."""
        why = self.unavailable()
        if why is not None:
            raise RuntimeError(f"no sandbox: {why}")
        switch = self._switch_user()
        assert self._bwrap is not None and self._prlimit is not None
        limits = [self._prlimit, "--fsize=0", "--core=0", "--"]
        bind = ["--ro-bind", os.path.realpath(workdir), BUNDLE_DIR]
        args = self._arguments(None, binds=bind, chdir=BUNDLE_DIR, env={"HOME": "/tmp"})
        return [self._bwrap, *self._namespaces(bool(switch)), *args, "--", *switch, *limits, *argv]

    @staticmethod
    def _namespaces(as_root: bool) -> list[str]:
        common = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if not as_root:
            return ["--unshare-user", *common]
        # Root needs no user namespace; it keeps only what setpriv needs to drop to the user.
        keep = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")
        return [*common, "--cap-drop", "ALL", *(w for c in keep for w in ("--cap-add", c))]

    def _arguments(
        self,
        mountinfo_fd: int | None,
        *,
        binds: Sequence[str] = (),
        chdir: str = "/",
        env: dict[str, str] | None = None,
    ) -> list[str]:
        """bwrap's arguments; ``binds`` are mounted in the sandbox's ``/tmp`` before it is made
        read-only."""
        args = [
            "--die-with-parent", "--new-session",
            "--ro-bind", "/", "/",
            "--proc", "/proc",
            "--dev", "/dev",
            "--tmpfs", "/tmp",
            *binds,
        ]  # fmt: skip
        if mountinfo_fd is not None:
            args += ["--dir", os.path.dirname(HOST_MOUNTINFO)]
            args += ["--file", str(mountinfo_fd), HOST_MOUNTINFO]
        masks, remount = _masks(self.hide, self.show)
        args += masks
        for path in ["/tmp", *remount]:  # tmpfs mounts are writable until remounted
            args += ["--remount-ro", path]
        args += ["--clearenv"]
        for key, value_ in {**child_env(), **(env or {})}.items():
            args += ["--setenv", key, value_]
        return [*args, "--chdir", chdir]


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _masks(hide: Sequence[str], show: Sequence[str]) -> tuple[list[str], list[str]]:
    """bwrap arguments that hide ``hide`` and show ``show`` again, the deeper path winning
    (the repository root under a hidden working directory stays readable, a config file inside
    it does not), and the tmpfs mounts to remount read-only afterwards.

    Paths under the sandbox's own ``/tmp``, ``/proc`` and ``/dev`` are hidden already.
    """
    ops = sorted(
        [(p, True) for p in hide] + [(p, False) for p in show],
        key=lambda op: (op[0].count("/"), op[0]),
    )
    done: list[tuple[str, bool]] = [("/tmp", True), ("/proc", True), ("/dev", True)]
    args: list[str] = []
    tmpfs: list[str] = []
    for path, hiding in ops:
        covering = [(p, h) for p, h in done if _under(path, p)]
        hidden_now = bool(covering) and covering[-1][1]
        done.append((path, hiding))
        if hiding == hidden_now or not os.path.lexists(path):
            continue
        if not hiding:
            # Directories bwrap creates on the way are root's and 0700: make them traversable.
            masks = [p for p, h in covering if h]
            for parent in map(str, reversed(Path(path).parents)):
                if any(_under(parent, m) and parent != m for m in masks):
                    args += ["--perms", "0755", "--dir", parent]
            args += ["--ro-bind", path, path]
        elif os.path.isdir(path):
            args += ["--tmpfs", path]
            tmpfs.append(path)
        else:
            args += ["--ro-bind", "/dev/null", path]
    return args, tmpfs


def _absolute(paths: Iterable[str | Path]) -> list[str]:
    out: list[str] = []
    for path in paths:
        real = os.path.realpath(os.path.abspath(str(path)))
        if real not in out:
            out.append(real)
    return out


def _host_mountinfo() -> bytes:
    try:
        return Path("/proc/self/mountinfo").read_bytes()
    except OSError:
        return b""
