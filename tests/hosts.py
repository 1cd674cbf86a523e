"""Separate hosts on one machine, for the cluster tests: Linux network namespaces on a private bridge.

Each host is a network namespace with one link to a bridge (itself in a namespace of its own, the "switch") and an
address in 10.28.0.0/24, which exists only inside these namespaces. A host also has its own mount, PID and UTS
namespaces: its own /tmp, /dev/shm, /run and home (/root), its own process tree (so that `ray stop` on one host
stops only that host's Ray, as on a real machine) and its own hostname. The rest of the filesystem is shared: every
host sees the checkout, its .venv and the test's folders at the same paths (as hosts sharing an NFS mount would),
wherever they are: a checkout under /tmp or /root is bound into each host's own (``shared_folders``).

A server host runs sshd on its address with a key made for the test (root login, that key only). The launcher host
runs no sshd: it is the user's machine, where `ray up` runs and the S3 stand-in listens.

Everything is created under one folder and named after the creating process (``dmlh<pid>-...``), and ``close()``
removes it all: the host's processes (SIGKILL to the first process of its PID namespace ends all of them), the
namespaces, the links and the folder. Needs root, ``ip``, ``unshare`` and Debian's openssh-server.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import wait_for

SUBNET = "10.28.0"  # a /24 that exists only on the bridge of these namespaces
PREFIX = "dmlh"
SSHD = "/usr/sbin/sshd"


def missing_tools() -> list[str]:
    """What this machine lacks to build the hosts (empty: it can)."""
    missing = [tool for tool in ("ip", "unshare", "ssh", "ssh-keygen", "rsync", "ss", "curl") if shutil.which(tool) is None]
    if not Path(SSHD).exists():
        missing.append(SSHD)
    if os.geteuid() != 0:
        missing.append("root")
    return missing


def run(argv: list[str], timeout: float = 60, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and out.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} exited {out.returncode}: {out.stderr.strip()[-2000:]}")
    return out


@dataclass
class Host:
    name: str
    ip: str
    netns: str
    link: str  # its link's end on the switch
    root: Path  # its folder: home/, tmp/, sshd_config, sshd.log
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def namespace_init(self) -> int | None:
        """The pid (as seen here) of the first process of the host's PID namespace: killing it ends them all."""
        if self.process is None or self.process.poll() is not None:
            return None
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        with contextlib.suppress(OSError):
            found = children.read_text().split()
            return int(found[0]) if found else None
        return None


PRIVATE = (Path("/root"), Path("/tmp"))  # what each host has its own of, among the folders a checkout may live in
# the names the cluster's hosts keep in their home (cluster.local.yaml): a checkout's folder of the same name is hidden
HOST_HOME_NAMES = ("dml", "venv", "data", "mlflow", ".aws", ".ssh")


def shared_folders() -> list[Path]:
    """The folders under /root or /tmp that every host must still see at their paths, though each host has its own
    /root and /tmp: the top folder under either of this checkout, its environment (as named and where it links to)
    and the environment's Python (a pyenv Python lives in /root/.pyenv). A checkout cloned under /tmp, with its
    .venv inside, is one of them."""
    checkout = Path(__file__).resolve().parents[1]
    paths = (checkout, Path(sys.prefix), Path(os.path.realpath(sys.prefix)), Path(os.path.realpath(sys.base_prefix)))
    found: list[Path] = []
    for path in paths:
        for private in PRIVATE:
            if path.is_relative_to(private) and path != private:
                top = private / path.relative_to(private).parts[0]
                if top not in found:
                    found.append(top)
    return found


def unshareable() -> str | None:
    """Why the hosts cannot see this checkout at its path (None: they can)."""
    for top in shared_folders():
        if top.parent == PRIVATE[0] and top.name in HOST_HOME_NAMES:
            return f"the checkout or its environment is in {top}, where each host keeps its own ~/{top.name}"
    return None


def private_mounts(host: Host, server: bool = True) -> str:
    """Shell lines that give a process in a new mount namespace the host's own home and /tmp (a server: /run and
    /dev/shm too; sshd's privilege separation folder is /run/sshd), with the shared folders bound in at their paths."""
    lines = []
    for top in shared_folders():
        own = host.home if top.parent == PRIVATE[0] else host.tmp
        lines.append(f"mkdir -p {own / top.name} && mount --bind {top} {own / top.name}")
    lines += [f"mount --rbind {host.home} /root", f"mount --rbind {host.tmp} /tmp"]
    if server:
        lines += ["mount -t tmpfs -o mode=755 tmpfs /run", "mkdir /run/sshd", "mount -t tmpfs -o mode=1777 tmpfs /dev/shm"]
    return " && ".join(lines)


class Hosts:
    """The switch, a launcher and the named server hosts; a context manager that removes all of it on exit."""

    def __init__(self, servers: list[str], base: Path | None = None) -> None:
        self.tag = f"{PREFIX}{os.getpid()}"
        self.base = Path(base or tempfile.mkdtemp(prefix=f"{self.tag}-", dir="/var/tmp"))
        self.switch = f"{self.tag}-sw"
        self.key = self.base / "ssh" / "id_ed25519"
        self.ssh_config = self.base / "ssh" / "config"
        names = ["launcher", *servers]
        self.hosts = {
            name: Host(name, f"{SUBNET}.{2 if i == 0 else 9 + i}", f"{self.tag}-{name}", f"{self.tag[-6:]}l{i}", self.base / "hosts" / name)
            for i, name in enumerate(names)
        }
        self.launcher = self.hosts["launcher"]
        self.servers = [self.hosts[name] for name in servers]
        self.created: list[str] = []

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __enter__(self) -> Hosts:
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- building -------------------------------------------------------------------------------------------------

    def build(self) -> None:
        sweep()
        run(["ip", "netns", "add", self.switch])
        self.created.append(self.switch)
        run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for host in self.hosts.values():
            for folder in ("home", "tmp"):
                (host.root / folder).mkdir(parents=True, exist_ok=True)
            host.tmp.chmod(0o1777)
            run(["ip", "netns", "add", host.netns])
            self.created.append(host.netns)
            # both ends are created inside the namespaces: nothing appears in this machine's own namespace
            run(["ip", "-n", self.switch, "link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", host.netns])
            run(["ip", "-n", self.switch, "link", "set", host.link, "master", "br0", "up"])
            run(["ip", "-n", host.netns, "addr", "add", f"{host.ip}/24", "dev", "eth0"])
            run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
            run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
            if host is not self.launcher:
                # a route out, as a real host has (to nowhere: the launcher forwards nothing); Ray finds a node's own
                # address from the route to a public one, and without any it takes 127.0.0.1
                run(["ip", "-n", host.netns, "route", "add", "default", "via", self.launcher.ip])
        self.make_keys()
        for host in self.servers:
            self.start_sshd(host)
        for host in self.servers:
            self.wait_for_sshd(host)

    def make_keys(self) -> None:
        folder = self.key.parent
        folder.mkdir(mode=0o700)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{self.tag}-client", "-f", str(self.key)])
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{self.tag}-host", "-f", str(folder / "host_ed25519")])
        shutil.copy(f"{self.key}.pub", folder / "authorized_keys")
        # host key checking off for these addresses only, and only for the test's own ssh (Ray passes its own options)
        self.ssh_config.write_text(
            f"Host {SUBNET}.*\n  User root\n  IdentityFile {self.key}\n  IdentitiesOnly yes\n  BatchMode yes\n"
            "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  ConnectTimeout 10\n"
        )
        for host in self.servers:
            (host.root / "sshd_config").write_text(
                f"ListenAddress {host.ip}:22\nHostKey {folder / 'host_ed25519'}\nAuthorizedKeysFile {folder / 'authorized_keys'}\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
                # the key's folders lie under /var/tmp (mode 1777), which StrictModes refuses for a key file
                "StrictModes no\nPidFile none\nPrintMotd no\nX11Forwarding no\nMaxSessions 64\nMaxStartups 64\n"
                "Subsystem sftp internal-sftp\n"
            )

    def start_sshd(self, host: Host) -> None:
        script = f"hostname {host.name} && {private_mounts(host)} && exec {SSHD} -D -e -f {host.root / 'sshd_config'}"
        argv = ["ip", "netns", "exec", host.netns, "unshare", "--mount", "--pid", "--fork", "--mount-proc", "--uts", "sh", "-c", script]
        log = open(host.root / "sshd.log", "w")  # noqa: SIM115 (kept open for sshd's life)
        host.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def wait_for_sshd(self, host: Host, timeout: float = 30) -> None:
        """Until sshd logs that it listens (fails if it exits first)."""
        log = host.root / "sshd.log"
        wait_for(lambda: "Server listening on" in log.read_text(), timeout, f"sshd of {host.name} to listen", host.process, every_s=0.05)

    # -- using ----------------------------------------------------------------------------------------------------

    def on_launcher(self, argv: list[str], timeout: float, cwd: str | Path | None = None, env: dict | None = None, check: bool = True):
        """Run ``argv`` on the launcher host (its network, its own /tmp and home)."""
        host = self.launcher
        script = f'{private_mounts(host, server=False)} && cd {shlex.quote(str(cwd or "/"))} && exec "$@"'
        wrapped = ["ip", "netns", "exec", host.netns, "unshare", "--mount", "sh", "-c", script, "sh", *argv]
        return run(wrapped, timeout=timeout, check=check, env=env)

    def ssh(self, host: Host, command: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        """``command`` in a login shell of ``host``, over ssh from the launcher."""
        return self.on_launcher(["ssh", "-F", str(self.ssh_config), host.ip, command], timeout=timeout, check=check)

    def in_netns(self, host: Host, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
        return run(["ip", "netns", "exec", host.netns, *argv], timeout=timeout)

    def partition(self, host: Host) -> None:
        """Cut the host's link at the switch: its packets go nowhere, its processes go on."""
        run(["ip", "-n", self.switch, "link", "set", host.link, "down"])

    def heal(self, host: Host) -> None:
        run(["ip", "-n", self.switch, "link", "set", host.link, "up"])

    def crash(self, host: Host) -> None:
        """SIGKILL every process of the host (its PID namespace ends with its first process)."""
        init = host.namespace_init()
        assert init is not None, f"{host.name} is not running"
        os.kill(init, signal.SIGKILL)
        host.process.wait(timeout=30)

    def boot(self, host: Host) -> None:
        """Start the host again after a crash: a new process tree with sshd; its home and /tmp are kept."""
        self.start_sshd(host)
        self.wait_for_sshd(host)

    def listening(self, host: Host) -> list[tuple[str, int, str]]:
        """(address, port, process) of every listening TCP socket in the host's network namespace."""
        out = self.in_netns(host, ["ss", "-ltnpH"]).stdout
        found = []
        for line in out.splitlines():
            fields = line.split()
            address, _, port = fields[3].rpartition(":")
            process = re.search(r'users:\(\("([^"]+)"', line)
            found.append((address.strip("[]"), int(port), process.group(1) if process else "?"))
        return found

    def pids(self, host: Host) -> list[int]:
        """The processes in the host's network namespace (as seen here)."""
        out = run(["ip", "netns", "pids", host.netns], check=False).stdout
        return [int(p) for p in out.split()]

    # -- removing -------------------------------------------------------------------------------------------------

    def close(self) -> None:
        for host in self.servers:
            init = host.namespace_init()
            if init is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(init, signal.SIGKILL)
            if host.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    host.process.wait(timeout=30)
        for netns in reversed(self.created):
            kill_netns(netns)
            run(["ip", "netns", "del", netns], check=False)
        self.created.clear()
        shutil.rmtree(self.base, ignore_errors=True)


def kill_netns(netns: str) -> None:
    """SIGKILL what still runs in ``netns`` (processes this module started there)."""
    for pid in run(["ip", "netns", "pids", netns], check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def sweep() -> None:
    """Remove the namespaces and folders of an earlier run of this module whose process is gone (a crashed test)."""
    for line in run(["ip", "netns", "list"], check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        found = re.fullmatch(rf"{PREFIX}(\d+)-\w+", name)
        if found and not Path(f"/proc/{found.group(1)}").exists():
            kill_netns(name)
            run(["ip", "netns", "del", name], check=False)
    for folder in Path("/var/tmp").glob(f"{PREFIX}*-*"):
        found = re.match(rf"{PREFIX}(\d+)-", folder.name)
        if found and not Path(f"/proc/{found.group(1)}").exists():
            shutil.rmtree(folder, ignore_errors=True)
