"""Progress and the closing summary: rich on a terminal, plain lines (and ::group::) in CI."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table


@dataclass(kw_only=True)
class SummaryRow:
    target: str
    step: str
    status: str  # "ok", "failed", "skipped", "waived"
    seconds: float
    detail: str = ""


@dataclass
class Reporter:
    """Created once by the CLI from the environment it was given; passed to every step."""

    github_actions: bool = False
    step_summary: Path | None = None
    console: Console = field(default_factory=lambda: Console(stderr=True, highlight=False))
    rows: list[SummaryRow] = field(default_factory=list)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Reporter:
        summary = env.get("GITHUB_STEP_SUMMARY")
        return cls(github_actions=env.get("GITHUB_ACTIONS") == "true", step_summary=Path(summary) if summary else None)

    def info(self, message: str) -> None:
        self.console.print(message)

    @contextlib.contextmanager
    def step(self, target: str, name: str) -> Iterator[SummaryRow]:
        """Times a step; the yielded row's ``detail`` can be filled in; a raise marks it failed."""
        row = SummaryRow(target=target, step=name, status="ok", seconds=0.0)
        if self.github_actions:
            print(f"::group::{target}: {name}", flush=True)
        self.console.print(f"[bold]▶ {target}: {name}[/bold]")
        start = time.perf_counter()
        try:
            yield row
        except BaseException as exc:
            row.status = "failed"
            row.detail = row.detail or str(exc).splitlines()[0][:160]
            if self.github_actions:
                print(f"::error::{target}: {name} failed: {row.detail}", flush=True)
            raise
        finally:
            row.seconds = time.perf_counter() - start
            self.rows.append(row)
            if self.github_actions:
                print("::endgroup::", flush=True)
            colour = {"ok": "green", "failed": "red"}.get(row.status, "yellow")
            self.console.print(f"  [{colour}]{row.status}[/{colour}] {row.seconds:.1f}s {row.detail}")

    def skip(self, target: str, name: str, reason: str, status: str = "skipped") -> None:
        self.rows.append(SummaryRow(target=target, step=name, status=status, seconds=0.0, detail=reason))
        self.console.print(f"[yellow]- {target}: {name} {status}: {reason}[/yellow]")

    def summary(self, title: str = "summary") -> None:
        table = Table(title=title)
        for column in ("target", "step", "status", "time", "detail"):
            table.add_column(column)
        for row in self.rows:
            table.add_row(row.target, row.step, row.status, f"{row.seconds:.1f}s", row.detail)
        self.console.print(table)
        if self.step_summary:
            lines = ["| target | step | status | time | detail |", "|---|---|---|---|---|"]
            lines += [f"| {r.target} | {r.step} | {r.status} | {r.seconds:.1f}s | {r.detail} |" for r in self.rows]
            with self.step_summary.open("a") as handle:
                handle.write(f"### {title}\n\n" + "\n".join(lines) + "\n")
