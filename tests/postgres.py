"""A private PostgreSQL server for the scale-out tests: Debian's binaries (`.ci/run` installs the
postgresql package), a data folder of its own, password authentication, stopped at the end.

As root (CI), the server runs as the `postgres` user the package creates: PostgreSQL refuses root.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

PASSWORD = "s3cret-Pw-7"   # the tests check it never reaches a log, the ledger or a commit


def binaries() -> Path | None:
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(folder) / "initdb").exists():
            return Path(folder)
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


class Postgres:
    def __init__(self, bin_dir: Path):
        self.bin = bin_dir
        self.folder = Path(tempfile.mkdtemp(prefix="agent-pg-"))
        self.data = self.folder / "data"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
        (self.folder / "pw").write_text(PASSWORD + "\n")
        if self.as_user:
            shutil.chown(self.folder, "postgres")
            shutil.chown(self.folder / "pw", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "agent", "-A", "scram-sha-256",
                  f"--pwfile={self.folder / 'pw'}", "--no-sync")
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([*self.as_user, str(self.bin / tool), *args], check=True, capture_output=True, timeout=120,
                       cwd=self.folder)

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.folder / "server.log"), "-w", "-o",
                  f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://agent:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh database for one test; its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.url().replace("postgresql://", "postgresql://", 1), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def close(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.folder, ignore_errors=True)
