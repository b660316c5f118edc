"""`interlude predictor`: train TetriInfer's length predictor and measure it (lengthpred/)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from interlude.extras import needs
from interlude.ui import make_console

if TYPE_CHECKING:
    from interlude.lengthpred.data import Sample
    from interlude.lengthpred.evaluate import Row

console = make_console()
predictor = typer.Typer(help="TetriInfer's output-length predictor.", no_args_is_help=True)

Trace = Annotated[
    Path | None, typer.Option(help="trace JSON with text segments (default: the shared trace)")
]


def _samples(trace: Path | None) -> list[Sample]:
    from interlude.lengthpred.data import load_samples
    from interlude_workloads.trace import default_trace_path

    path = trace or default_trace_path()
    if path is None:
        raise typer.BadParameter("no shared trace in this checkout: pass --trace FILE")
    return load_samples(path)


@predictor.command("eval")
@needs("predictor")
def eval_cmd(
    granularities: Annotated[str, typer.Option(help="bucket sizes in tokens, comma list")] = (
        "16,32,100,200,400"
    ),
    held_out: Annotated[float, typer.Option(help="share of conversations held out")] = 0.25,
    trace: Trace = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the rows here")] = None,
    plot: Annotated[Path | None, typer.Option(help="write a bar chart here")] = None,
) -> None:
    """Train on most conversations, measure on the rest, against the baselines and the paper."""
    from interlude.lengthpred.data import split
    from interlude.lengthpred.encoder import WordLlamaEncoder
    from interlude.lengthpred.evaluate import as_dicts, evaluate

    try:
        sizes = [int(g) for g in granularities.split(",")]
        if min(sizes) < 1:
            raise ValueError(f"granularities must be >= 1 token, got {granularities!r}")
        train, test = split(_samples(trace), held_out)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    enc = WordLlamaEncoder()
    console.print(f"{len(train)} training and {len(test)} held-out segments; {enc.name}")
    rows = []
    for g in sizes:
        rows.append(evaluate(train, test, g, enc))
        console.print(f"  granularity {g}: {rows[-1].accuracy:.1%}")
    console.print(_table(rows))
    if json_out is not None:
        meta = {"encoder": enc.name, "train": len(train), "held_out": len(test)}
        json_out.write_text(json.dumps({"meta": meta, "rows": as_dicts(rows)}, indent=1))
        console.print(f"wrote {json_out}")
    if plot is not None:
        from interlude.lengthpred.plot import accuracy_bars

        accuracy_bars(rows, plot)
        console.print(f"wrote {plot}")


def _table(rows: Sequence[Row]) -> Table:
    table = Table("granularity", "buckets", "predictor", "most common", "kind's most common",
                  "kind's mean", "paper", "MAE expected", "MAE likeliest", "MAE kind mean",
                  "ms/request")  # fmt: skip
    for r in rows:
        table.add_row(
            str(r.granularity), str(r.buckets), f"{r.accuracy:.1%}", f"{r.majority:.1%}",
            f"{r.kind_majority:.1%}", f"{r.kind_mean:.1%}",
            f"{r.paper:.1%}" if r.paper is not None else "-", f"{r.mae_tokens:.1f}",
            f"{r.mae_likeliest:.1f}", f"{r.mae_kind_mean:.1f}", f"{r.ms_per_request:.2f}",
        )  # fmt: skip
    return table


@predictor.command("train")
@needs("predictor")
def train_cmd(
    out: Annotated[Path, typer.Option(help="the model file to write (.npz)")],
    granularity: Annotated[int, typer.Option(help="bucket size in tokens")] = 32,
    trace: Trace = None,
) -> None:
    """Train on every conversation of the trace and save the model."""
    from interlude.lengthpred.encoder import WordLlamaEncoder
    from interlude.lengthpred.model import LengthPredictor

    try:
        model = LengthPredictor.fit(_samples(trace), granularity, WordLlamaEncoder())
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    model.save(out)
    console.print(f"wrote {out}: {model.buckets} buckets of {granularity} tokens")
