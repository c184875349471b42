"""How a chaos scenario is judged: every scenario's `judge` returns one `Verdict`, the pass
figure it promised beside the figure it measured, and `table` prints them as the report does."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Verdict:
    scenario: str  # the name in the report's table (mostly the scenario's name on the command line)
    pass_figure: str  # what passing means, in figures, said before measuring
    measured: str  # what was measured, in the same terms
    passed: bool
    figures: dict  # everything the scenario measured (DIR/chaos.json)

    def to_json(self) -> dict:
        return asdict(self)


def table(verdicts: list[Verdict]) -> str:
    rows = ["| scenario | pass figure | measured | result |", "|---|---|---|---|"]
    rows += [f"| {v.scenario} | {v.pass_figure} | {v.measured} | {'pass' if v.passed else 'FAIL'} |" for v in verdicts]
    return "\n".join(rows)
