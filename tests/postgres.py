"""A throwaway PostgreSQL cluster for the tests: Debian's server binaries (``.ci/run`` installs the
``postgresql`` package when they are missing), a fresh data folder, a free local port, password
authentication over TCP. Nothing outside the temporary folder is touched."""
from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

PASSWORD = "phaze-test"


def find_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    hits = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                  key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return hits[-1] if hits else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def cluster():
    """Yields ``(url, port)``: ``postgresql://phaze:PASSWORD@127.0.0.1:PORT/phaze`` of a new server."""
    initdb, pg_ctl = find_bin("initdb"), find_bin("pg_ctl")
    if not (initdb and pg_ctl):
        raise FileNotFoundError("PostgreSQL server binaries (initdb, pg_ctl) not found")
    tmp = Path(tempfile.mkdtemp(prefix="phaze-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:           # the server refuses to run as root: run it as `postgres`
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(tmp, "postgres")
    tmp.chmod(0o755)
    pw = tmp / "pw"
    pw.write_text(PASSWORD + "\n")
    if as_user:
        shutil.chown(pw, "postgres")
    data, port = tmp / "data", _free_port()
    run = lambda *a: subprocess.run([*as_user, *a], check=True, capture_output=True, timeout=120)  # noqa: E731
    try:
        run(initdb, "-D", str(data), "-U", "phaze", f"--pwfile={pw}", "--auth-host=scram-sha-256",
            "--auth-local=trust", "-E", "UTF8", "--no-sync")
        run(pg_ctl, "-D", str(data), "-l", str(tmp / "log"), "-w", "-t", "60", "start", "-o",
            f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1 -c max_connections=100 -c fsync=off")
        run(find_bin("psql") or "psql", "-h", str(tmp), "-p", str(port), "-U", "phaze", "-d", "postgres",
            "-c", "CREATE DATABASE phaze")
        yield f"postgresql://phaze:{PASSWORD}@127.0.0.1:{port}/phaze", port
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True,
                       timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
