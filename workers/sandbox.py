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

For the diagnostics (:meth:`Sandbox.run`) the network namespace is the host's: ``ss`` and ``ip``
must see the host's sockets and links, and they are allow-listed programs. **Bundle code**
(:meth:`Sandbox.confine`: a skill-manifest script, a plugin's MCP stdio server) gets a network
namespace of its own, with nothing in it but its loopback: it reaches neither the host's
loopback (the runtime's Redis, its database, its API) nor anything else. A plugin the install
granted the network reaches it only through the worker's egress proxy (:mod:`workers.egress`),
bridged onto the sandbox's loopback (:mod:`workers._egress_bridge`) and named by the standard
proxy variables; the proxy refuses the runtime's own services whatever the grant.

The interpreter the worker runs on (its Python installation, and the virtual environment it
uses) stays readable even where it lies under a hidden path such as root's home: a bundle's
Python server needs one, and it holds no secret.

Where bubblewrap is missing or the kernel refuses the namespaces, :meth:`Sandbox.unavailable`
says why and nothing runs: neither the diagnostics nor bundle code ever run unconfined.
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
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = [
    "BUNDLE_DIR",
    "EGRESS_PORT",
    "HOST_MOUNTINFO",
    "PLUGIN_DATA_DIR",
    "SAFE_PATH",
    "Completed",
    "Sandbox",
    "run_argv",
]

#: The only PATH a command gets, in the sandbox and out: system directories, never the worker's.
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Where the host's mount table appears inside the sandbox.
HOST_MOUNTINFO = "/tmp/.host/mountinfo"
#: Where :meth:`Sandbox.confine` shows a bundle's folder (a skill's scripts run from there).
BUNDLE_DIR = "/tmp/bundle"
#: Where a plugin granted a writable folder finds it (``CLAUDE_PLUGIN_DATA``).
PLUGIN_DATA_DIR = "/tmp/plugin-data"
#: The port of the egress bridge on the sandbox's own loopback.
EGRESS_PORT = 3128
#: Where the egress proxy's socket and the bridge appear in the sandbox.
_EGRESS_SOCKET = "/tmp/.egress/proxy.sock"
_EGRESS_BRIDGE = "/tmp/.egress/bridge.py"
#: The most a plugin's MCP server granted a writable folder may write into one file.
_WRITABLE_FSIZE = 1024**3
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
        interpreter = [sys.base_prefix, sys.prefix]  # see the module docstring
        self.show = [p for p in _absolute([*show, *interpreter]) if os.path.exists(p)]
        #: The worker's egress proxy (a :class:`workers.egress.EgressProxy`), for bundle code a
        #: plugin's install granted the network; ``None``: no bundle code gets any.
        self.egress: Any = None
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

    def confine(
        self,
        argv: Sequence[str],
        *,
        workdir: str,
        network: str = "",
    ) -> list[str]:
        """The command line that runs ``argv`` confined as :meth:`run` does, in a network
        namespace of its own, with ``workdir`` (a bundle's folder) bound read-only at
        :data:`BUNDLE_DIR` and its working directory there, for a caller that starts and
        supervises the process itself. Paths of ``argv`` under ``workdir`` must already be
        written as under :data:`BUNDLE_DIR`. ``network`` names who was granted the network
        (the plugin), for the egress proxy; empty: none.

        bwrap binds ``workdir`` before it drops privileges, so the folders above it need not be
        readable by the sandbox's user; the files in it must be. :class:`RuntimeError` when
        the sandbox (or, for ``network``, the egress proxy) is unavailable: nothing then runs
        unconfined, and nothing falls back to the host's network."""
        switch = self._ready()
        bind = ["--ro-bind", os.path.realpath(workdir), BUNDLE_DIR]
        env = {"HOME": "/tmp"}
        wrap: list[str] = []
        if network:
            extra, wrap, proxy_env = self._egress(network)
            bind += extra
            env.update(proxy_env)
        args = self._arguments(None, binds=bind, chdir=BUNDLE_DIR, env=env)
        return self._command(args, switch, [*wrap, *argv], fsize=0)

    def confine_server(
        self,
        argv: Sequence[str],
        *,
        root: str,
        plugin: str,
        network: bool = False,
        writable: str = "",
    ) -> tuple[list[str], dict[str, str]]:
        """The command line that runs a plugin's MCP stdio server ``argv`` confined, and the
        variables to add to its environment: namespaces of its own (the network's too), the
        filesystem read-only with the worker's files hidden, the plugin's installed folder
        ``root`` readable at its own path (so ``${CLAUDE_PLUGIN_ROOT}`` keeps working) and its
        working directory. With ``network``, the egress proxy as for :meth:`confine`; with
        ``writable`` (a host folder, made for the plugin), that folder read-write at
        :data:`PLUGIN_DATA_DIR` (``CLAUDE_PLUGIN_DATA``), and files up to 1 GiB instead of none.

        The environment is not on the command line (other local users read command lines):
        the caller gives the process its environment, which bwrap passes on as it is."""
        switch = self._ready()
        binds: list[str] = []
        added: dict[str, str] = {}
        wrap: list[str] = []
        if network:
            extra, wrap, proxy_env = self._egress(plugin)
            binds += extra
            added.update(proxy_env)
        fsize = 0
        if writable:
            binds += ["--bind", os.path.realpath(writable), PLUGIN_DATA_DIR]
            added["CLAUDE_PLUGIN_DATA"] = PLUGIN_DATA_DIR
            fsize = _WRITABLE_FSIZE
        real_root = os.path.realpath(root)
        args = self._arguments(None, binds=binds, chdir=real_root, env=None, show=[real_root])
        return self._command(args, switch, [*wrap, *argv], fsize=fsize), added

    def owner(self) -> tuple[int, int]:
        """(uid, gid) bundle code runs as: the sandbox user's when the worker is root."""
        if os.geteuid() != 0:
            return os.geteuid(), os.getegid()
        account = pwd.getpwnam(self.user)
        return account.pw_uid, account.pw_gid

    def _ready(self) -> list[str]:
        why = self.unavailable()
        if why is not None:
            raise RuntimeError(f"no sandbox: {why}")
        assert self._bwrap is not None and self._prlimit is not None
        return self._switch_user()

    def _command(
        self, args: list[str], switch: list[str], argv: Sequence[str], *, fsize: int
    ) -> list[str]:
        assert self._bwrap is not None and self._prlimit is not None
        limits = [self._prlimit, f"--fsize={fsize}", "--core=0", "--"]
        namespaces = [*self._namespaces(bool(switch)), "--unshare-net"]
        return [self._bwrap, *namespaces, *args, "--", *switch, *limits, *argv]

    def _egress(self, label: str) -> tuple[list[str], list[str], dict[str, str]]:
        """The binds, the command prefix and the variables that route ``label``'s bundle code
        through the egress proxy; :class:`RuntimeError` when there is no proxy to route to."""
        if self.egress is None:
            raise RuntimeError("no egress proxy on this worker: the network cannot be granted")
        python = shutil.which("python3", path=SAFE_PATH)
        if python is None:
            raise RuntimeError(
                f"no python3 in {SAFE_PATH}: the sandbox's bridge to the egress proxy needs one"
            )
        from workers import _egress_bridge

        socket_path = self.egress.socket_for(label)
        binds = [
            # bwrap makes the folders on the way root's and 0700: the sandbox's user must enter.
            "--perms", "0755", "--dir", os.path.dirname(_EGRESS_SOCKET),
            "--ro-bind", socket_path, _EGRESS_SOCKET,
            "--ro-bind", os.path.realpath(_egress_bridge.__file__), _EGRESS_BRIDGE,
        ]  # fmt: skip
        wrap = [python, "-I", "-S", _EGRESS_BRIDGE, str(EGRESS_PORT), _EGRESS_SOCKET, "--"]
        proxy = f"http://127.0.0.1:{EGRESS_PORT}"
        env = {
            name: proxy
            for base in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
            for name in (base, base.lower())
        }
        env.update(NO_PROXY="", no_proxy="")
        return binds, wrap, env

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
        env: dict[str, str] | None = {},  # noqa: B006 - read only; None: keep the caller's
        show: Sequence[str] = (),
    ) -> list[str]:
        """bwrap's arguments; ``binds`` are mounted in the sandbox's ``/tmp`` before it is made
        read-only, ``show`` are more paths to show again; ``env`` is the whole environment
        (with the clean one), ``None`` leaves the process's own as bwrap got it."""
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
        masks, remount = _masks(self.hide, [*self.show, *show])
        args += masks
        for path in ["/tmp", *remount]:  # tmpfs mounts are writable until remounted
            args += ["--remount-ro", path]
        if env is not None:
            args += ["--clearenv"]
            for key, value_ in {**child_env(), **env}.items():
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
